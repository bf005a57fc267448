"""The vector store behind ``sapiens2 search``, measured: FAISS and LanceDB side by side.

For each collection size: build time and size on disk, single-query latency p50/p95 and
recall@10 of the approximate index against exact search (numpy, the same vectors). The vectors
are synthetic, of the real widths (768: the 0.1b CLS embedding, the default appearance vector;
616: a pose vector, 308 x 2), drawn around cluster centres like real embeddings (uniform random
vectors have no neighbours worth finding, every ANN index fails on them). Queries are held-out
points of the same mixture. Prints the machine's load average: numbers on a shared box move.

    python bench/search.py --json search.json                      # 10k, 100k, 1M at width 768
    python bench/search.py --sizes 10000 --engines faiss --json s.json
    python bench/search.py --sizes 1000000 --engines lancedb-ivf_flat --nprobes 16,32,64 --json s.json
    python bench/search.py --engines lancedb-ivf_hnsw_sq --partitions 4 --centres 10000 --spread 0.5

Engines: faiss, lancedb-ivf_flat, lancedb-ivf_pq, lancedb-ivf_sq, lancedb-ivf_hnsw_sq. LanceDB rows
report the write (100k appends) and index times apart, the folder's size, one row per --nprobes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("LANCE_LOG", "error")  # lance warns on every search that omits _distance
os.environ.setdefault("RUST_LOG", "error")


def clustered(n: int, dim: int, seed: int, centres: np.ndarray, spread: float = 0.35) -> np.ndarray:
    """``n`` unit vectors around the unit ``centres`` (a mixture: most of a real embedding's mass)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), np.float32)
    for a in range(0, n, 50_000):  # in chunks: the noise of 1M x 768 at once is 3 GB more
        m = min(50_000, n - a)
        x = (
            centres[rng.integers(0, len(centres), m)]
            + spread * rng.standard_normal((m, dim), np.float32) / np.sqrt(dim) * 3
        )
        out[a : a + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def exact(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """The true top-k ids per query (cosine of unit vectors: the dot product), in chunks."""
    best_s = np.full((len(queries), k), -np.inf, np.float32)
    best_i = np.zeros((len(queries), k), np.int64)
    for a in range(0, len(data), 200_000):
        s = queries @ data[a : a + 200_000].T
        ids = np.argpartition(-s, k - 1, axis=1)[:, :k]
        cand_s = np.concatenate([best_s, np.take_along_axis(s, ids, 1)], 1)
        cand_i = np.concatenate([best_i, ids + a], 1)
        top = np.argsort(-cand_s, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, top, 1), np.take_along_axis(cand_i, top, 1)
    return best_i


def recall(found: list[np.ndarray], truth: np.ndarray) -> float:
    return float(
        np.mean([len(set(f.tolist()) & set(t.tolist())) / len(t) for f, t in zip(found, truth, strict=True)])
    )


def latencies(search, queries: np.ndarray) -> tuple[list[np.ndarray], dict[str, float]]:
    found, times = [], []
    search(queries[0])  # warm (first touch of the index's pages)
    for q in queries:
        t0 = time.perf_counter()
        found.append(search(q))
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    return found, {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95))}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bench_faiss(data: np.ndarray, queries: np.ndarray, truth: np.ndarray, tmp: Path, k: int) -> dict:
    import faiss

    n, dim = data.shape
    nlist = max(1, int(4 * np.sqrt(n)))
    t0 = time.perf_counter()
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(1)
    train = data[np.sort(rng.choice(n, min(n, 40 * nlist), replace=False))]
    index.train(train)
    index.add(data)
    build = time.perf_counter() - t0
    faiss.write_index(index, str(tmp / "faiss.index"))
    out = {"engine": "faiss IVF-Flat", "build_s": build, "bytes": (tmp / "faiss.index").stat().st_size,
           "nlist": nlist, "rows": []}  # fmt: skip
    for nprobe in (16, 32, 64):
        index.nprobe = nprobe
        found, lat = latencies(lambda q: index.search(q.reshape(1, -1), k)[1][0], queries)
        out["rows"].append({"nprobe": nprobe, "recall@10": recall(found, truth), **lat})
    return out


def lance_config(kind: str, parts: int, dim: int):
    """The LanceDB index of ``kind`` (cosine): IVF_FLAT, IVF_PQ, IVF_SQ or IVF_HNSW_SQ."""
    from lancedb.index import IvfFlat, IvfHnswSq, IvfPq, IvfSq

    if kind == "IVF_FLAT":
        return IvfFlat(distance_type="cosine", num_partitions=parts)
    if kind == "IVF_PQ":
        return IvfPq(distance_type="cosine", num_partitions=parts, num_sub_vectors=dim // 8)
    if kind == "IVF_SQ":
        return IvfSq(distance_type="cosine", num_partitions=parts)
    if kind == "IVF_HNSW_SQ":
        return IvfHnswSq(distance_type="cosine", num_partitions=parts)
    raise SystemExit(f"unknown LanceDB index {kind!r}: IVF_FLAT, IVF_PQ, IVF_SQ or IVF_HNSW_SQ")


def bench_lancedb(
    data: np.ndarray, queries: np.ndarray, truth: np.ndarray, tmp: Path, k: int, kind: str, tune: dict
) -> dict:
    import lancedb
    import pyarrow as pa

    n, dim = data.shape
    db = lancedb.connect(str(tmp / "lance"))
    t0 = time.perf_counter()
    table = None
    for a in range(0, n, 100_000):  # appended in parts, as an index run adds its chunks
        chunk = data[a : a + 100_000]
        t = pa.table({"id": np.arange(a, a + len(chunk)),
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(chunk.reshape(-1)), dim)})  # fmt: skip
        if table is None:
            table = db.create_table("v", t)
        else:
            table.add(t)
    write = time.perf_counter() - t0
    parts = tune["partitions"] or max(1, int(np.sqrt(n)))  # sqrt(n): what the store makes
    config = lance_config(kind, parts, dim)
    t1 = time.perf_counter()
    table.create_index("vector", config=config)
    out = {"engine": f"lancedb {kind}", "write_s": write, "index_s": time.perf_counter() - t1,
           "build_s": time.perf_counter() - t0, "bytes": folder_bytes(tmp / "lance"), "partitions": parts,
           "rows": []}  # fmt: skip

    def search(q: np.ndarray, nprobes: int, refine: int | None) -> np.ndarray:
        s = table.search(q, vector_column_name="vector").distance_type("cosine").nprobes(nprobes)
        if refine:
            s = s.refine_factor(refine)
        return np.asarray(s.select(["id", "_distance"]).limit(k).to_arrow().column("id"))

    refine = tune["refine"] or (10 if kind in ("IVF_PQ", "IVF_SQ", "IVF_HNSW_SQ") else None)
    for nprobes in tune["nprobes"]:
        found, lat = latencies(lambda q, n=nprobes, r=refine: search(q, n, r), queries)
        out["rows"].append({"nprobes": nprobes, "refine": refine, "recall@10": recall(found, truth), **lat})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--engines", default="faiss,lancedb-ivf_flat,lancedb-ivf_pq")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--nprobes", default="16,32,64", help="LanceDB: partitions probed, one row each")
    p.add_argument("--partitions", type=int, default=0, help="LanceDB: IVF partitions (0: sqrt(n))")
    p.add_argument("--refine", type=int, default=0, help="LanceDB: refine factor (0: 10 for quantised)")
    p.add_argument("--centres", type=int, default=1000, help="cluster centres of the synthetic vectors")
    p.add_argument("--spread", type=float, default=0.35, help="noise around a centre (larger: harder)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    tune = {"nprobes": [int(x) for x in args.nprobes.split(",")], "partitions": args.partitions,
            "refine": args.refine}  # fmt: skip
    k, dim = 10, args.dim
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "load_before": os.getloadavg(),
            "dim": dim, "queries": args.queries, "k": k, "centres": args.centres, "spread": args.spread}  # fmt: skip
    results = []
    centres = np.random.default_rng(0).standard_normal((args.centres, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for n in (int(s) for s in args.sizes.split(",")):
        data = clustered(n, dim, 1, centres, args.spread)
        queries = clustered(args.queries, dim, 2, centres, args.spread)
        t0 = time.perf_counter()
        truth = exact(data, queries, k)
        exact_ms = (time.perf_counter() - t0) / len(queries) * 1e3
        for engine in args.engines.split(","):
            tmp = Path(tempfile.mkdtemp(prefix="bench-search-"))
            try:
                if engine == "faiss":
                    r = bench_faiss(data, queries, truth, tmp, k)
                else:
                    r = bench_lancedb(data, queries, truth, tmp, k, engine.split("-", 1)[1].upper(), tune)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            r.update(n=n, dim=dim, exact_numpy_ms_per_query_batched=exact_ms, load=os.getloadavg())
            results.append(r)
            best = max(r["rows"], key=lambda x: x["recall@10"])
            print(f"n={n:>8} {r['engine']:<18} build {r['build_s']:8.1f} s  {r['bytes'] / 1e6:8.1f} MB  "
                  f"best recall@10 {best['recall@10']:.3f} p50 {best['p50_ms']:.1f} ms  (load {os.getloadavg()[0]:.1f})",
                  flush=True)  # fmt: skip
            meta["load_after"] = os.getloadavg()
            if args.json:
                Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        del data
    return 0


if __name__ == "__main__":
    sys.exit(main())
