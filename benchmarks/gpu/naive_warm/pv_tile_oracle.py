"""What the model would gain if it knew which tile cuBLAS picks for the naive P V GEMM: every sweep's P V GEMM
rows predicted again with the CTAs cuBLAS ran (rows of O a CTA from the ncu kernel name, nvjet_sm90_hsh_MxN; two
CTAs sharing a row tile where M is half of d), the Q K GEMM and the softmax as the model has them. Rows within
10% / 1 MiB of the measured DRAM bytes, the calibration sweep's fit rows and the rest, the model against this
oracle.

    python benchmarks/gpu/naive_warm/pv_tile_oracle.py > benchmarks/gpu/naive_warm/pv_tile_oracle.txt
"""

import sys
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pv_kernels import TILE, kernel_names
from unseen_counts import report

import simflash.algorithms.naive as naive_algorithm
from simflash.chip import l2_cache
from simflash.config import gpu_spec
from simflash.model import physical
from simflash.model.calibration import REGIME_REPORTS, within

GPU = "H200"


def cublas_tile(names: list[str], d: int) -> tuple[int, int]:
    """(rows of O a CTA, CTAs sharing a row tile) of the P V GEMM kernel that ran."""
    (match,) = {m.groups()[:2] for m in map(TILE.search, names) if m}
    columns, rows = map(int, match)
    return rows, d // columns


def play_with_tile(rows: int, sharing: int):
    """The model's play of a naive kernel, the P V GEMM's CTAs taking `rows` rows of O, `sharing` CTAs a row tile."""

    def play(kernel, sched, heads, d, itemsize, wave_rows, softmax_rows, l2):
        if kernel != "gemm_pv":
            return physical._play_naive_kernel(kernel, sched, heads, d, itemsize, wave_rows, softmax_rows, l2)
        model_rows, naive_algorithm.GEMM_TILE_ROWS = naive_algorithm.GEMM_TILE_ROWS, rows
        try:
            cublas_wave_rows = gpu_spec(GPU).sm_count // sharing * rows
            return physical._play_naive_kernel(kernel, sched, heads, d, itemsize, cublas_wave_rows, softmax_rows, l2)
        finally:
            naive_algorithm.GEMM_TILE_ROWS = model_rows

    return play


def oracle_bytes(job: tuple) -> tuple[int, int]:
    """(DRAM read, write bytes) of one P V GEMM row with cuBLAS's tile."""
    config, cache, tile = job
    spec = gpu_spec(GPU)
    kernels = physical._naive(spec, l2_cache(spec), config["n"], config["n"], config["d"], config["heads"],
                              config["causal"], "upper_left", 2, cache, play=play_with_tile(*tile))
    (pv,) = (k for k in kernels if k.kernel == "gemm_pv")
    return pv.dram_read_bytes, pv.dram_write_bytes


def main() -> None:
    names = {cache: kernel_names(cache) for cache in ("cold", "warm")}
    rows = [(sweep, row) for sweep, name in REGIME_REPORTS.items() for row in report(name, None)["rows"]
            if row["kernel"] == "gemm_pv"]
    jobs = []
    for sweep, row in rows:
        c = row["config"]
        ran = names[row["cache"]][sweep, c["heads"], c["n"], c["d"], c["causal"]]
        jobs.append((c, row["cache"], cublas_tile(ran, c["d"])))
    with Pool(2) as pool:
        oracle = pool.map(oracle_bytes, jobs, chunksize=4)
    counts: Counter = Counter()
    for (_, row), (read, written) in zip(rows, oracle):
        part = "fit" if row["subset"] == "fit" else "unseen"
        for what, key, guess in (("reads", "dram_read_bytes", read), ("writes", "dram_write_bytes", written)):
            counts[part, row["cache"], what, "rows"] += 1
            counts[part, row["cache"], what, "model"] += within(row["predicted"][key], row["measured"][key])
            counts[part, row["cache"], what, "oracle"] += within(guess, row["measured"][key])
    print("Naive P V GEMM rows within 10% / 1 MiB of ncu's DRAM bytes: the model (256 rows of O a CTA) / with the tile")
    print("cuBLAS ran (rows of O a CTA and CTAs a row tile from the ncu kernel name), the other kernels as the model")
    for part in ("fit", "unseen"):
        for cache in ("cold", "warm"):
            for what in ("reads", "writes"):
                model, oracle, total = (counts[part, cache, what, column] for column in ("model", "oracle", "rows"))
                print(f"  {part:6s} {cache} {what:6s}: {model:3d} / {oracle:3d} of {total}")


if __name__ == "__main__":
    main()
