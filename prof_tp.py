import cProfile, pstats, sys, dataclasses
import numpy as np
from bench import common, throughput as tp
def main():
    common.ensure_flags_parsed()
    specs = common.lognormal_corpus(False)
    files = {n: common.prepare_corpus(s) for n, s in specs.items()}
    seeds = {n: s.seed for n, s in specs.items()}
    maxl = {n: s.max_length for n, s in specs.items()}
    mesh = common.single_device_mesh()
    names = list(specs)
    weights = {n: common.MIXTURE_WEIGHTS[n] for n in names}
    var = tp.Variant(True, sys.argv[1] == "packed", 0)
    sizes = tp.FULL
    import xlstm_data.reading as rd, grain
    rd.DEFAULT_READ_THREADS = 0; tp.BASELINE_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    ours = common.our_iterator(files, weights, seeds, seq_len=1024, batch_size=8, packed=var.packed, workers=0, mesh=mesh, eod_token_id=1, packing_bins=8)
    host = ours.dataloader
    base = tp.grain_pipeline(files, weights, seeds, maxl, var, sizes)
    for name, ds in (("ours", host), ("grain", base)):
        it = iter(ds)
        for _ in range(10): next(it)
        pr = cProfile.Profile(); pr.enable()
        for _ in range(300): next(it)
        pr.disable()
        print("=====", name)
        pstats.Stats(pr).sort_stats("cumulative").print_stats("xlstm_data|prometheus|mix|source.py|map.py", 25)
    ours.close()
if __name__ == "__main__":
    main()
