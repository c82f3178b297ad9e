"""Fixtures of the serving tests: one tiny model behind one server for the module, and `openai` clients on it."""

from __future__ import annotations

import openai
import pytest
from transformers import AutoTokenizer

from hyflow.agent.parsers import ToolParser
from hyflow.engine.config import EngineConfig
from hyflow.engine.engine import LLMEngine
from hyflow.models.tiny import build_tiny_model
from hyflow.serving import ServingState, build_app
from hyflow.serving.server import BackgroundServer

MODEL = "tiny-chat"
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("serving") / "tiny", hidden_size=32, num_layers=2)


def make_state(model_path: str, **config) -> ServingState:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    values = dict(max_model_len=MAX_MODEL_LEN, num_kv_blocks=1024, block_size=16) | config
    engine = LLMEngine(model_path, EngineConfig(**values), tokenizer)
    return ServingState(engine, MODEL, ToolParser.get("hermes", tokenizer))


@pytest.fixture(scope="module")
def state(model_path) -> ServingState:
    return make_state(model_path)


@pytest.fixture(scope="module")
def server(state):
    with BackgroundServer(build_app(state)) as running:
        yield running


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
