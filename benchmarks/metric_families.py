"""The `vllm:` metric families two /metrics texts expose, and their differences: which families
each has, their types, label names and histogram bucket bounds (`benchmarks/vllm_diff.py`
compares pagedserve's against vLLM's with it).

A family is named as vLLM declares it (`vllm:prompt_tokens`, not `..._total`); the `_created`
gauges prometheus_client adds beside counters and histograms are left out.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:"
# differences README's vLLM compatibility section explains: (family, aspect) -> why
DOCUMENTED_METRIC_DIFFERENCES = {
    ("vllm:mm_cache_queries", "present"): "no multimodal models, so no multimodal cache",
    ("vllm:mm_cache_hits", "present"): "no multimodal models, so no multimodal cache",
    ("vllm:external_prefix_cache_queries", "present"): "no KV connector (no KV from other "
    "instances); the engines' own prefix caches are vllm:prefix_cache_*",
    ("vllm:external_prefix_cache_hits", "present"): "no KV connector (no KV from other "
    "instances); the engines' own prefix caches are vllm:prefix_cache_*",
    ("vllm:estimated_flops_per_gpu", "present"): "no per-step FLOP/byte model in the engine "
    "(benchmarks/e2e_flops.py measures it offline); vLLM's CPU build reports 0 here",
    ("vllm:estimated_read_bytes_per_gpu", "present"): "no per-step FLOP/byte model in the "
    "engine (benchmarks/e2e_flops.py measures it offline); vLLM's CPU build reports 0 here",
    ("vllm:estimated_write_bytes_per_gpu", "present"): "no per-step FLOP/byte model in the "
    "engine (benchmarks/e2e_flops.py measures it offline); vLLM's CPU build reports 0 here",
    ("vllm:cache_config_info", "labels"): "labels engine, block_size and num_gpu_blocks only: "
    "vLLM's other labels are its CacheConfig fields (mamba, offloading, ...), which ours lacks",
}


def families(text: str) -> dict[str, dict[str, Any]]:
    """{name: {"type", "labels" (sorted, without `le`), "buckets" (None if no histogram
    samples)}} for each `vllm:` family of a Prometheus text exposition."""
    found: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        if family.type == "gauge" and family.name.endswith("_created"):
            continue  # prometheus_client's creation time of a counter or histogram
        labels = sorted({k for s in family.samples for k in s.labels if k != "le"})
        found[family.name] = {"type": family.type, "labels": labels,
                              "buckets": _first_buckets(family)}  # fmt: skip
    return found


def _first_buckets(family: Any) -> list[str] | None:
    """The `le` bounds of the family's first label set, as written."""
    bounds: list[str] = []
    first_labels = None
    for sample in family.samples:
        if not sample.name.endswith("_bucket"):
            continue
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        first_labels = labels if first_labels is None else first_labels
        if labels == first_labels:
            bounds.append(str(float(sample.labels["le"])))
    return bounds or None


def diff_families(ours: dict[str, dict], theirs: dict[str, dict]) -> list[dict[str, Any]]:
    """Each difference: {"family", "aspect" (present/type/labels/buckets), "ours", "theirs",
    "documented", "why"}."""
    differences = []
    for name in sorted(set(ours) | set(theirs)):
        if name not in ours or name not in theirs:
            entry = (name, "present", name in ours, name in theirs)
            differences.append(entry)
            continue
        a, b = ours[name], theirs[name]
        for aspect in ("type", "labels"):
            if a[aspect] != b[aspect]:
                differences.append((name, aspect, a[aspect], b[aspect]))
        if a["buckets"] and b["buckets"] and a["buckets"] != b["buckets"]:
            differences.append((name, "buckets", a["buckets"], b["buckets"]))
    return [
        {"family": name, "aspect": aspect, "ours": x, "theirs": y,
         "documented": (name, aspect) in DOCUMENTED_METRIC_DIFFERENCES,
         "why": DOCUMENTED_METRIC_DIFFERENCES.get((name, aspect), "")}
        for name, aspect, x, y in differences
    ]  # fmt: skip


def markdown_lines(ours: dict, theirs: dict, differences: list[dict[str, Any]]) -> list[str]:
    """The report's section on metric families."""
    same = len(set(ours) & set(theirs)) - len({d["family"] for d in differences
                                                if d["aspect"] != "present"})  # fmt: skip
    undocumented = sum(not d["documented"] for d in differences)
    lines = ["", "## `vllm:` metric families (/metrics after the corpus)", "",
             f"vLLM {len(theirs)} families, pagedserve {len(ours)}; {same} identical in type, "
             f"label names and bucket bounds; {len(differences)} differences "
             f"({len(differences) - undocumented} documented, {undocumented} not).", "",
             "| family | aspect | ours | vLLM | documented: why |",
             "|---|---|---|---|---|"]  # fmt: skip
    for d in differences:
        why = d["why"] if d["documented"] else "**not documented**"
        lines.append(f"| `{d['family']}` | {d['aspect']} | {_short(d['ours'])} | "
                     f"{_short(d['theirs'])} | {why} |")  # fmt: skip
    return lines


def _short(value: Any) -> str:
    text = ", ".join(value) if isinstance(value, list) else str(value)
    return (text[:80] + "...") if len(text) > 80 else text
