"""`hyflow serve-retrieval`: BM25 over a JSONL corpus, answering real HTTP requests on loopback."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from hyflow.agent.retrieval_server import BM25Index, RetrievalServer, load_corpus, main

pytestmark = pytest.mark.timeout(60)

CORPUS = [
    {"id": "paris", "contents": "Paris\nParis is the capital and largest city of France."},
    {"id": "berlin", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"id": "otter", "contents": "Sea otter\nThe sea otter is a marine mammal of the North Pacific."},
    {"text": "Photosynthesis turns light, water and carbon dioxide into sugar."},
]


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in CORPUS) + "\n")
    return path


@pytest.fixture
def server(corpus_file):
    server = RetrievalServer(BM25Index(load_corpus(corpus_file)), port=0, topk=2).start()
    yield server
    server.close()


def post(url: str, payload) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_load_corpus_accepts_contents_title_text_and_text_rows(corpus_file):
    documents = load_corpus(corpus_file)
    assert documents[1] == {"id": "berlin", "contents": "Berlin\nBerlin is the capital of Germany."}
    assert documents[3]["id"] == "3" and documents[3]["contents"].startswith("Photosynthesis")


def test_the_server_returns_the_best_matching_documents_first(server):
    status, answer = post(f"{server.url}/retrieve", {"queries": ["capital of France", "sea otter"], "topk": 3})
    assert status == 200
    france, otter = answer["result"]
    assert [hit["document"]["id"] for hit in france] == ["paris", "berlin"]  # no shared term with the others
    assert france[0]["score"] > france[1]["score"] > 0
    assert [hit["document"]["id"] for hit in otter] == ["otter"]


def test_topk_defaults_to_the_server_setting_and_scores_can_be_left_out(server):
    _, answer = post(f"{server.url}/retrieve", {"queries": ["capital"], "return_scores": False})
    assert len(answer["result"][0]) == 2 and "score" not in answer["result"][0][0]


def test_health_reports_the_number_of_documents(server):
    with urllib.request.urlopen(f"{server.url}/health", timeout=10) as response:
        assert json.loads(response.read()) == {"status": "ok", "num_documents": 4}


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{not json", "Expecting property name"),
        ({"queries": "capital"}, '"queries" must be a list of strings'),
        ({"queries": ["a"], "topk": 0}, '"topk" must be an integer in'),
    ],
)
def test_bad_requests_get_a_400_with_the_reason(server, payload, message):
    status, answer = post(f"{server.url}/retrieve", payload)
    assert status == 400 and message in answer["error"]


def test_a_corpus_line_without_text_is_named_in_the_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"contents": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match="line 2 needs a 'contents' or 'text' field"):
        load_corpus(path)
    assert main(["--corpus", str(path)]) == 2


def test_the_hyflow_command_serves_the_corpus_over_http(corpus_file):
    import subprocess
    import sys

    command = [sys.executable, "-m", "hyflow", "serve-retrieval", "--corpus", str(corpus_file), "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # "serving 4 documents at http://127.0.0.1:PORT/retrieve (Ctrl-C to stop)"
        assert line.startswith("serving 4 documents at http://127.0.0.1:")
        status, answer = post(line.split()[4], {"queries": ["Germany"], "topk": 1})
        assert status == 200 and answer["result"][0][0]["document"]["id"] == "berlin"
    finally:
        process.terminate()
        process.wait(timeout=10)
