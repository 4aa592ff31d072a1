"""An lm-eval task as a `blockdraft eval` set (`--set lm-eval:TASK`): the task runs twice through
lm-eval's own `simple_evaluate`, once on an engine with the drafter and once without, over one
loaded target; lm-eval's per-document scores become the paired outcomes.

An item counts as correct when the task's first metric is 1 under its first filter (exact_match,
acc, ...); a task whose metric is not 0/1 per document (bleu, perplexity) reports its aggregate
scores but no accuracy or McNemar test. Identical answers compare lm-eval's raw responses.
"""

from __future__ import annotations

import time

from ..engine.engine import sized_engine
from ..errors import ConfigError
from .stats import mcnemar_exact, mean_al_ci, paired_counts

PREFIX = "lm-eval:"


def _per_doc(samples: list[dict]) -> tuple[str, str, dict[int, dict]]:
    """(filter, metric, {doc_id: sample}) for the first filter and metric lm-eval logged."""
    first = samples[0]
    metric, name = first["metrics"][0], first["filter"]
    return name, metric, {s["doc_id"]: s for s in samples if s["filter"] == name}


def run_lm_eval_task(llm, cfg, include_path: str | None, num_fewshot: int | None, chat: bool) -> dict:
    """`cfg` is the EvalConfig (`set` = "lm-eval:TASK", `prompts` = lm-eval's limit)."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        from ..lm_eval.model import BlockdraftLM
    except ImportError as e:
        raise ConfigError(f"--set {cfg.set} needs lm-eval: pip install 'blockdraft[bench]' ({e})") from None
    task = cfg.set[len(PREFIX):]
    manager = TaskManager(include_path=include_path, include_defaults=include_path is None)
    if task not in manager.all_tasks:
        raise ConfigError(f"--set {cfg.set}: lm-eval knows no task {task!r}"
                          + (f" in {include_path}" if include_path else " (--include-path names a folder of task "
                                                                       "YAML files)"))
    max_len = min(llm.target.config.max_position_embeddings, 4096)       # prompt + answer, per request
    gen = {"do_sample": True, "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k} \
        if cfg.temperature > 0 else None
    results, models = {}, {}
    for arm, drafter in (("speculative", llm.drafter), ("plain", None)):
        if arm == "plain" and not cfg.compare_plain:
            continue
        engine = sized_engine(llm.target, drafter, cfg.max_batch, max_len, llm._eos_ids(),
                              cfg.adaptive and drafter is not None)
        models[arm] = BlockdraftLM.around(llm, engine, "none" if drafter is None else "drafter",
                                          cfg.max_new_tokens, cfg.seed)
        started = time.perf_counter()
        results[arm] = simple_evaluate(model=models[arm], tasks=[task], limit=cfg.prompts, num_fewshot=num_fewshot,
                                       apply_chat_template=chat, gen_kwargs=gen, log_samples=True,
                                       task_manager=manager, random_seed=cfg.seed)
        results[arm]["seconds"] = time.perf_counter() - started
    return _report(cfg, task, results, models, llm.drafter)


def _arm(result: dict, model, task: str) -> tuple[dict, dict[int, dict], str, str]:
    name, metric, docs = _per_doc(result["samples"][task])
    values = [d[metric] for d in docs.values()]
    binary = all(v in (0, 1, True, False) for v in values)
    stats = model.acceptance()
    summary = {"tokens": stats["generated_tokens"], "seconds": result["seconds"],
               "tokens_per_s": stats["tokens_per_s"], "correct": int(sum(values)) if binary else None,
               "accuracy": sum(values) / len(values) if binary and values else None,
               "lm_eval_results": result["results"][task]}
    return summary, docs, name, metric


def _report(cfg, task: str, results: dict, models: dict, drafter) -> dict:
    spec, spec_docs, filt, metric = _arm(results["speculative"], models["speculative"], task)
    acc = models["speculative"].acceptance()
    al = mean_al_ci(models["speculative"].acceptance_lengths)
    steps = [a for lengths in models["speculative"].acceptance_lengths for a in lengths]
    block = drafter.config.num_draft_tokens + 1
    spec.update(mean_al=al["mean_al"], al_ci95=al["ci95"], steps=al["steps"],
                al_histogram=[sum(a == k for a in steps) for k in range(1, block + 1)],
                per_position_acceptance=acc["per_position_acceptance"])
    ids = sorted(spec_docs)
    report = {"set": cfg.set, "items": len(ids), "scored": spec["accuracy"] is not None,
              "greedy": cfg.temperature == 0, "drafter_kind": drafter.config.kind,
              "block_size": drafter.config.block_size, "lm_eval": {"task": task, "filter": filt, "metric": metric},
              "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}, "speculative": spec}
    rows = [{"id": f"{task}/{i}", "speculative": spec_docs[i][metric]} for i in ids]
    if "plain" in results:
        plain, plain_docs, _, _ = _arm(results["plain"], models["plain"], task)
        report["plain"] = plain
        same = [spec_docs[i]["resps"] == plain_docs[i]["resps"] for i in ids]
        report["identical"] = sum(same)
        report["mismatches"] = [f"{task}/{i}" for i, ok in zip(ids, same) if not ok]
        report["speedup"] = spec["tokens_per_s"] / plain["tokens_per_s"] \
            if spec["tokens_per_s"] and plain["tokens_per_s"] else None
        if report["scored"]:
            table = paired_counts([bool(plain_docs[i][metric]) for i in ids], [bool(spec_docs[i][metric]) for i in ids])
            report["paired"] = {"both": table["both"], "only_plain": table["only_first"],
                                "only_speculative": table["only_second"], "neither": table["neither"],
                                "difference": spec["accuracy"] - plain["accuracy"],
                                "mcnemar_p": mcnemar_exact(table["only_first"], table["only_second"])}
        for row, i, ok in zip(rows, ids, same):
            row.update(plain=plain_docs[i][metric], identical=ok)
    report["per_item"] = rows
    return report
