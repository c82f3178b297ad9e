"""`hyflow serve`: an OpenAI-compatible HTTP API on hyflow's generation engine, on FastAPI + uvicorn.

    from hyflow.serving import ServingState, build_app
    app = build_app(ServingState(LLMEngine(path, config, tokenizer), model_name="tiny"))   # an ASGI app

Files: schema (the requests' pydantic models), requests (request -> prompt ids + SamplingParams, the checks), text
(stop strings, streamed text), responses (choices, log-probs, tool calls), completions and chat (the two endpoints,
whole or streamed), media (image and video parts to the processor's inputs), videos (decoding clips), media_urls
(where a part's bytes come from), media_budget (the parts' counts, bytes and pixels, checked before decoding),
preparation (templates, tokenizing and decoding off the event loop), generation (prompts on the async engine),
limits (body size, disconnects), metrics (Prometheus), state, app (routes and errors), server (`hyflow serve`).
"""

from hyflow.serving.app import build_app
from hyflow.serving.state import ServerLimits, ServingState

__all__ = ["ServerLimits", "ServingState", "build_app"]
