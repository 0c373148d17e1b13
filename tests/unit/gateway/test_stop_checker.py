from __future__ import annotations

from pagedserve.services.gateway.output_processor import ChoiceProcessor
from pagedserve.services.gateway.stop_checker import StopChecker
from pagedserve.shared.protocol import TokenDelta


def feed(stop, pieces):
    checker = StopChecker(tuple(stop))
    shown = [checker.add(p) for p in pieces]
    return shown, checker


def test_no_stop_strings_pass_everything():
    shown, checker = feed([], ["a", "b"])
    assert shown == ["a", "b"] and checker.flush() == ""


def test_match_inside_one_piece_cuts_before_it():
    shown, checker = feed(["END"], ["abcENDxyz"])
    assert shown == ["abc"] and checker.matched == "END"


def test_match_across_pieces_holds_back_the_partial_prefix():
    shown, checker = feed(["###"], ["Hello #", "#", "# more"])
    assert shown == ["Hello ", "", ""]
    assert checker.matched == "###"
    assert checker.add("after") == "" and checker.flush() == ""


def test_partial_that_does_not_complete_is_released():
    shown, checker = feed(["###"], ["a #", "#b"])
    assert shown == ["a ", "##b"] and checker.matched is None


def test_held_back_tail_is_flushed_at_the_end():
    shown, checker = feed(["stop here"], ["text stop"])
    assert shown == ["text "]
    assert checker.flush() == "stop"


def test_earliest_of_several_stop_strings_wins():
    shown, checker = feed(["world", "lo"], ["hello world"])
    assert shown == ["hel"] and checker.matched == "lo"


def test_overlapping_prefixes():
    shown, checker = feed(["aab"], ["a", "a", "a", "b"])
    assert "".join(shown) == "a" and checker.matched == "aab"


def deltas_for(info, text, finish="length"):
    ids = info.tokenizer.encode(text, add_special_tokens=False)
    return [
        TokenDelta("r", [t], finish_reason=finish if i == len(ids) - 1 else None)
        for i, t in enumerate(ids)
    ]


def test_processor_stops_across_token_boundaries_and_asks_for_abort(info):
    processor = ChoiceProcessor(info, ("世界",), want_logprobs=False)
    updates = [processor.process(d) for d in deltas_for(info, "你好世界 and more")]
    hit = [u for u in updates if u.finish_reason == "stop"]
    assert len(hit) == 1 and hit[0].stopped_by_string
    assert processor.text == "你好" and "世" not in "".join(u.text for u in updates)
    assert processor.finish_reason == "stop"


def test_processor_without_a_hit_returns_the_full_text(info):
    processor = ChoiceProcessor(info, ("zzz",), want_logprobs=False)
    for delta in deltas_for(info, "all of it zz"):
        processor.process(delta)
    assert processor.text == "all of it zz" and processor.finish_reason == "length"


def test_stop_string_in_the_last_delta_needs_no_abort(info):
    processor = ChoiceProcessor(info, ("it",), want_logprobs=False)
    updates = [processor.process(d) for d in deltas_for(info, "do it", finish="stop")]
    assert processor.text == "do " and not any(u.stopped_by_string for u in updates)
