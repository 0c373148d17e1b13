from benchmarks.draft_replay import ngram_drafts, oracle_drafts, replay_level

PROMPT = [7, 8, 9]
LOOPING = [1, 2, 3, 4] * 10  # from its second lap on, every n-gram draft is right
COUNTING = list(range(100, 140))  # no n-gram ever recurs: no drafts


def test_without_drafts_a_request_takes_a_step_per_token():
    replay = replay_level([(PROMPT, COUNTING)], 1, 0, 32)
    assert (replay.steps, replay.drafted) == (len(COUNTING), 0)
    assert replay.rows == len(PROMPT) + len(COUNTING) - 1


def test_ngram_drafts_shorten_a_repeating_text_only():
    looping = replay_level([(PROMPT, LOOPING)], 1, 3, 32)
    counting = replay_level([(PROMPT, COUNTING)], 1, 3, 32)
    assert looping.steps < len(LOOPING) // 2
    assert looping.accepted > 0 and looping.accepted <= looping.drafted
    assert (counting.steps, counting.drafted) == (len(COUNTING), 0)


def test_oracle_drafts_give_k_plus_one_tokens_a_step():
    replay = replay_level([(PROMPT, COUNTING)], 1, 3, 32, oracle_drafts)
    # the prompt's step gives 1 token, then 4 a step: 39 more tokens in 10 steps
    assert replay.steps == 1 + -(-(len(COUNTING) - 1) // 4)
    assert replay.accepted == replay.drafted


def test_in_flight_limit_queues_requests_behind_the_first():
    requests = [(PROMPT, COUNTING), (PROMPT, [5, 6])]
    one_at_a_time = replay_level(requests, 1, 0, 32)
    together = replay_level(requests, 2, 0, 32)
    assert one_at_a_time.last_admitted_step == len(COUNTING)
    assert one_at_a_time.steps == len(COUNTING) + 2
    assert (together.steps, together.last_admitted_step) == (len(COUNTING), 0)


def test_no_drafts_in_steps_over_the_speculative_limit():
    requests = [(PROMPT, LOOPING)] * 3
    assert replay_level(requests, 3, 3, 2, ngram_drafts).drafted == 0
    assert replay_level(requests, 3, 3, 3, ngram_drafts).drafted > 0
