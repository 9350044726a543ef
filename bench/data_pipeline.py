"""The input pipeline at scale: time to first step, peak memory, batches/s, input waits.

    python bench/data_pipeline.py [--pairs 1000000] [--config configs/multi30k_de_en.py]
        [--steps 60] [--repo PATH] [--corpus_dir /tmp/attnmt_corpora] [--json OUT]

`--pairs 0` trains on Multi30k itself; `--pairs N` on a generated `text` corpus of N
pairs made from the vendored Multi30k training set with no download: pair k joins two
training pairs drawn with a fixed seed ("A. B" ||| "A'. B'"), about 26 words a side, so
most pairs are distinct as in a real corpus of that size. It is written once to
`--corpus_dir/pairs<N>.{de,en}` and reused.

Each phase launches `python train.py` from `--repo` (default: this checkout; give an
older checkout to measure the code before a change in the same sitting) as a user
would, with a fresh data cache ($XDG_CACHE_HOME pointed at a new folder; the XLA
compilation cache is the user's own, as a user would have it), and stops it with
SIGTERM once its first step is logged (log_every_steps=1):
  cold    a new workdir, an empty data cache: read, train the tokenizer, encode
  resume  the same workdir again (restores the checkpoint SIGTERM saved)
  second  a new workdir on the same data (the cache's tokenizer and ids)
reporting `first_step_s` (launch to the first step's metrics record, the compile
included), `compile_s` (the run's own CompileTimer, from the same record) and
`peak_rss_gb` (the process's peak resident memory, from wait4; the pipeline runs in a
thread, so this is every process of the run). Then `steady`: the resumed run trains
`--steps` more steps logging every 10, and `input_wait` is the fraction of the loop's
wall time spent blocked on `next(batches)` (train.py's `input_wait_fraction`, steps
after the first window, which holds compilations). Last, `pipeline_batches_per_s`: this
process iterates the cached data through TrainBatcher (+ packing when the config packs)
alone for 300 batches (only with a --repo that has data/cache.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import finish  # noqa: E402

MULTI30K = REPO / "data" / "multi30k"


def generate_corpus(pairs: int, folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """Writes `folder/pairs<N>.de` and `.en` (once; reused when complete): pair k joins
    Multi30k training pairs a_k and b_k, drawn with `seed`. Returns the two paths."""
    import numpy as np

    source, target = folder / f"pairs{pairs}.de", folder / f"pairs{pairs}.en"
    done = folder / f"pairs{pairs}.done"
    if done.is_file():
        return source, target
    folder.mkdir(parents=True, exist_ok=True)
    de, en = (gzip.decompress((MULTI30K / f"train.{lang}.gz").read_bytes()).decode().splitlines()
              for lang in ("de", "en"))
    rng = np.random.default_rng(seed)
    first, second = rng.integers(0, len(de), pairs), rng.integers(0, len(de), pairs)
    with open(source, "w", encoding="utf-8") as fs, open(target, "w", encoding="utf-8") as ft:
        for a, b in zip(first.tolist(), second.tolist(), strict=True):
            fs.write(f"{de[a].strip()} {de[b].strip()}\n")
            ft.write(f"{en[a].strip()} {en[b].strip()}\n")
    done.touch()
    return source, target


def read_records(metrics: Path) -> list[dict]:
    """The complete lines of a metrics.jsonl being written (none if it does not exist)."""
    if not metrics.is_file():
        return []
    lines = metrics.read_text().split("\n")[:-1]  # the last piece may be half written
    return [json.loads(line) for line in lines if line]


def launch(repo: Path, args: list[str], env: dict, workdir: Path, stop_after: int,
           timeout: float) -> dict:
    """Runs train.py until it has logged `stop_after` train records, then SIGTERM (it saves
    a checkpoint and exits); returns first_step_s, compile_s, peak_rss_gb, exit, records."""
    metrics = workdir / "metrics.jsonl"
    seen = len(read_records(metrics))
    start = time.time()
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: it never fills up
        process = subprocess.Popen([sys.executable, str(repo / "train.py"), *args], cwd=repo,
                                   env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
        first, ended, stopping = None, None, False
        while ended is None and time.time() - start < timeout:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)  # rusage of this child
            if pid:
                ended = status, usage
                break
            train = [r for r in read_records(metrics)[seen:] if r["split"] == "train"]
            first = first or (train[0] if train else None)
            if len(train) >= stop_after and not stopping:
                process.send_signal(signal.SIGTERM)  # once: a second one interrupts at once
                stopping = True
            time.sleep(0.05)
        if ended is None:
            process.kill()
            ended = os.wait4(process.pid, 0)[1:]
        status, usage = ended
        process.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        stderr = log.read()
    records = read_records(metrics)[seen:]
    first = first or next((r for r in records if r["split"] == "train"), None)
    if first is None:
        raise RuntimeError(f"train.py logged no step; its stderr ends:\n{stderr[-2000:]}")
    return {"first_step_s": round(first["time"] - start, 2),
            "compile_s": round(first.get("compile_seconds", float("nan")), 2),
            "peak_rss_gb": round(usage.ru_maxrss / 1e6, 3),
            "exit": os.waitstatus_to_exitcode(status),
            "records": [r for r in records if r["split"] == "train"]}


def pipeline_rates(cfg, batches: int = 300) -> dict[str, float]:
    """Batches/s of the cached data through the input pipeline alone, in this process:
    `attnmt` is train.py's (`make_batcher`: padded buckets, or packed rows when the config
    packs, in a prefetch thread); `grain_threads` the same batches through grain's
    MapDataset with 2 reader threads (when grain is installed: a candidate replacement)."""
    from data.batching import prefetch
    from data.cache import DataCache
    from data.packing import make_batcher
    from data.streaming import training_source

    source = training_source(cfg.data)
    cache = DataCache(cfg.data.cache_dir)
    corpus = cache.scan(source)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = cache.tokenizer(Path(tmp) / "tokenizer", cfg.data, source, corpus)
        src, tgt, _ = cache.encoded(source, corpus, tokenizer, Path(tmp) / "tokenizer",
                                    cfg.data.max_length, cfg.data.long_pairs)
    batcher = make_batcher(src, tgt, cfg.train.batch_tokens, cfg.data.max_length,
                           pack_length=cfg.data.pack_length, bucket_step=cfg.data.bucket_step,
                           seed=cfg.train.seed)

    def rate(iterator) -> float:
        next(iterator)  # thread start-up and the epoch plan are not the steady rate
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        return round(batches / (time.perf_counter() - start), 1)

    rates = {"attnmt": rate(prefetch(batcher.iterate()))}
    try:
        import grain
    except ImportError:
        return rates

    def load(index: int) -> dict:
        return batcher.batch(*batcher.position(index))

    dataset = grain.MapDataset.range(10 * batches).map(load)
    rates["grain_threads"] = rate(iter(dataset.to_iter_dataset(
        grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))))
    return rates


def run(args) -> dict:
    repo = Path(args.repo).resolve()
    root = Path(tempfile.mkdtemp(prefix="attnmt_data_bench_"))
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "xdg"), "PYTHONUNBUFFERED": "1"}
    overrides = [f"--config={args.config}", "--config.train.log_every_steps=1",
                 "--config.eval.every_steps=0", "--config.checkpoint.every_steps=100000",
                 "--config.attention_maps.enabled=false", "--config.train.num_steps=100000"]
    if args.pairs:
        source, target = generate_corpus(args.pairs, Path(args.corpus_dir))
        overrides += ["--config.data.dataset=text", f"--config.data.train_source={source}",
                      f"--config.data.train_target={target}",
                      f"--config.data.valid_source={MULTI30K / 'val.de.gz'}",
                      f"--config.data.valid_target={MULTI30K / 'val.en.gz'}"]
    phases = {}
    for phase, workdir in (("cold", "w1"), ("resume", "w1"), ("second", "w2")):
        result = launch(repo, [*overrides, f"--workdir={root / workdir}"], env, root / workdir,
                        stop_after=1, timeout=args.timeout)
        result.pop("records")
        phases[phase] = result
        print(f"{phase}: {result}", file=sys.stderr, flush=True)
    steady = launch(repo, [*overrides, f"--workdir={root / 'w1'}",
                           "--config.train.log_every_steps=10"],
                    env, root / "w1", stop_after=1 + args.steps // 10, timeout=args.timeout)
    waits = [r.get("input_wait_fraction") for r in steady["records"][1:]]
    phases["steady"] = {"steps": args.steps, "peak_rss_gb": steady["peak_rss_gb"],
                        "input_wait": (round(sum(waits) / len(waits), 4)
                                       if waits and None not in waits else None),
                        "tokens_per_sec": round(sum(r["tokens_per_sec"] for r in
                                                    steady["records"][1:]) /
                                                max(len(steady["records"]) - 1, 1))}
    rate = None
    if (repo / "data" / "cache.py").is_file() and repo == REPO:
        from configs.resolved import load_config_json

        cfg = load_config_json(root / "w1")  # the run's own resolved config
        cfg.data.cache_dir = str(root / "xdg" / "attnmt" / "data")
        rate = pipeline_rates(cfg)
    return {"pairs": args.pairs or "multi30k", "config": args.config, "repo": str(repo),
            "commit": subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip(),
            "phases": phases, "pipeline_batches_per_s": rate,
            "machine": f"{os.cpu_count()} CPU cores", "date": time.strftime("%Y-%m-%d")}


def print_table(result: dict) -> None:
    print(f"data pipeline, {result['pairs']} pairs, {result['config']}, "
          f"{result['repo']} @ {result['commit']} ({result['machine']})")
    print(f"{'phase':>8} {'first step s':>13} {'compile s':>10} {'peak RSS GB':>12}")
    for phase in ("cold", "resume", "second"):
        p = result["phases"][phase]
        print(f"{phase:>8} {p['first_step_s']:13.1f} {p['compile_s']:10.1f} "
              f"{p['peak_rss_gb']:12.2f}")
    steady = result["phases"]["steady"]
    print(f"steady: {steady['steps']} steps, input wait {steady['input_wait']} of the loop, "
          f"{steady['tokens_per_sec']} tokens/s; pipeline alone "
          f"batches/s: {result['pipeline_batches_per_s']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000,
                        help="generated pairs (0 = Multi30k itself)")
    parser.add_argument("--config", default="configs/multi30k_de_en.py")
    parser.add_argument("--steps", type=int, default=60, help="steps of the steady phase")
    parser.add_argument("--repo", default=str(REPO), help="checkout whose train.py runs")
    parser.add_argument("--corpus_dir", default=os.path.join(tempfile.gettempdir(),
                                                             "attnmt_corpora"))
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per phase")
    parser.add_argument("--json", type=Path)
    finish(parser.parse_args(), run, print_table)


if __name__ == "__main__":
    main()
