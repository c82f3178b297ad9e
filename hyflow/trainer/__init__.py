"""hyflow.trainer: the single controller of RL training.

`main_ppo` is the Hydra entry (`python -m hyflow.trainer.main_ppo key=value ...`, also `hyflow train`): it loads
and checks the config (`hyflow.config`) and hands it to the PPO trainer.
"""
