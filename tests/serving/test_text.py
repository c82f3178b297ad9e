"""Stop strings cut from the text, and streamed text released only once it is settled."""

from __future__ import annotations

from hyflow.serving.text import TextStream, TokenTexts, cut_at_stop, stop_prefix_length


def test_the_text_is_cut_before_the_earliest_stop_string_or_after_it_when_kept():
    assert cut_at_stop("a, b. c", [".", ","], include_stop=False) == ("a", True)
    assert cut_at_stop("a, b. c", [".", ","], include_stop=True) == ("a,", True)
    assert cut_at_stop("abc", ["x"], include_stop=False) == ("abc", False)


def test_the_tail_that_could_still_become_a_stop_string_is_measured():
    assert stop_prefix_length("hello EN", ["END"]) == 2
    assert stop_prefix_length("hello", ["END"]) == 0


def test_a_stream_holds_back_a_possible_stop_and_a_partial_character_until_they_settle():
    stream = TextStream(["END"], include_stop=False)
    assert stream.delta("one E", final=False) == "one "
    assert stream.delta("one EX", final=False) == "EX"  # not a stop after all
    assert stream.delta("one EX caf\ufffd", final=False) == " caf"
    assert stream.delta("one EX café END more", final=False) == "é "
    assert stream.delta("one EX café END more", final=True) == ""


def test_each_tokens_own_text_is_decoded_once_and_then_looked_up():
    calls = []

    class Tokenizer:
        def decode(self, ids):
            calls.append(ids)
            return f"<{ids[0]}>"

    token_text = TokenTexts(Tokenizer())
    assert [token_text(t) for t in [5, 7, 5, 5]] == ["<5>", "<7>", "<5>", "<5>"]
    assert calls == [[5], [7]]
