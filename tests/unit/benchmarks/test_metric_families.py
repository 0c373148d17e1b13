"""The metric-family half of the differential check, on canned /metrics texts."""

from __future__ import annotations

from benchmarks.metric_families import diff_families, families, markdown_lines

THEIRS = """# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 3.0
# HELP vllm:prompt_tokens_created Prompt tokens.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:mm_cache_hits_total Multimodal.
# TYPE vllm:mm_cache_hits_total counter
vllm:mm_cache_hits_total{engine="0",model_name="m"} 0.0
# HELP vllm:x_seconds A histogram.
# TYPE vllm:x_seconds histogram
vllm:x_seconds_bucket{engine="0",le="0.5",model_name="m"} 1.0
vllm:x_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1.0
vllm:x_seconds_count{engine="0",model_name="m"} 1.0
vllm:x_seconds_sum{engine="0",model_name="m"} 0.2
# HELP vllm:new_gauge A gauge only vLLM has.
# TYPE vllm:new_gauge gauge
vllm:new_gauge{engine="0"} 1.0
# HELP process_cpu_seconds_total Not a vllm family.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.0
"""
OURS = """# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="e",model_name="m"} 5.0
# TYPE vllm:x_seconds histogram
vllm:x_seconds_bucket{engine="e",le="1.0",model_name="m"} 1.0
vllm:x_seconds_bucket{engine="e",le="+Inf",model_name="m"} 1.0
vllm:x_seconds_count{engine="e",model_name="m"} 1.0
vllm:x_seconds_sum{engine="e",model_name="m"} 0.2
# TYPE vllm:only_ours gauge
vllm:only_ours{model_name="m"} 1.0
"""


def test_families_name_type_labels_and_buckets():
    theirs = families(THEIRS)
    assert set(theirs) == {"vllm:prompt_tokens", "vllm:mm_cache_hits", "vllm:x_seconds",
                           "vllm:new_gauge"}  # fmt: skip
    assert theirs["vllm:prompt_tokens"] == {"type": "counter", "labels": ["engine", "model_name"],
                                            "buckets": None}  # fmt: skip
    assert theirs["vllm:x_seconds"]["buckets"] == ["0.5", "inf"]


def test_differences_are_tagged_documented_only_when_listed():
    differences = diff_families(families(OURS), families(THEIRS))
    found = {(d["family"], d["aspect"]): d for d in differences}
    assert set(found) == {("vllm:mm_cache_hits", "present"), ("vllm:new_gauge", "present"),
                          ("vllm:only_ours", "present"), ("vllm:x_seconds", "buckets")}  # fmt: skip
    assert found["vllm:mm_cache_hits", "present"]["documented"]
    assert "multimodal" in found["vllm:mm_cache_hits", "present"]["why"]
    assert not found["vllm:new_gauge", "present"]["documented"]
    assert found["vllm:only_ours", "present"]["ours"] is True
    lines = markdown_lines(families(OURS), families(THEIRS), differences)
    assert "1 identical" in lines[3] and "(1 documented, 3 not)" in lines[3]
