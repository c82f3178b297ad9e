"""hyflow: reinforcement-learning post-training of large language models.

A single controller writes the RL dataflow as a plain loop (`hyflow.trainer`); SPMD worker groups
(`hyflow.controller`) run the heavy compute; `hyflow.protocol.DataProto` carries batches between them.
"""

__version__ = "0.1.0"
