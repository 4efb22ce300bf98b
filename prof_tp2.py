import sys, time
import numpy as np
from bench import common, throughput as tp
def main():
    common.ensure_flags_parsed()
    specs = common.lognormal_corpus(False)
    files = {n: common.prepare_corpus(s) for n, s in specs.items()}
    seeds = {n: s.seed for n, s in specs.items()}
    maxl = {n: s.max_length for n, s in specs.items()}
    mesh = common.single_device_mesh()
    names = list(specs) if sys.argv[2] == "3src" else ["web"]
    weights = {n: common.MIXTURE_WEIGHTS[n] for n in names} if len(names) > 1 else None
    var = tp.Variant(len(names) > 1, sys.argv[1] == "packed", 0)
    f = {n: files[n] for n in names}
    import xlstm_data.reading as rd, grain
    if len(sys.argv) > 3: rd.DEFAULT_READ_THREADS = 0; tp.BASELINE_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    ours = common.our_iterator(f, weights, seeds, seq_len=1024, batch_size=8, packed=var.packed, workers=0, mesh=mesh, eod_token_id=1, packing_bins=8)
    host = ours.dataloader
    base = tp.grain_pipeline(f, weights, seeds, maxl, var, tp.FULL)
    for r in range(4):
        for name, ds, key in (("ours", host, "targets_segmentation"), ("grain", base, "targets_segment_ids")):
            it = iter(ds)
            for _ in range(10): next(it)
            t = time.perf_counter(); tok = 0
            for _ in range(300): tok += int(np.count_nonzero(next(it)[key]))
            print(name, round(tok / (time.perf_counter() - t) / 1e6, 2), tok, end="  |  ")
        print()
    ours.close()
if __name__ == "__main__":
    main()
