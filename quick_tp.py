import dataclasses, sys
from bench import common, throughput as tp
common.ensure_flags_parsed()
def main():
    specs = common.lognormal_corpus(False)
    files = {n: common.prepare_corpus(s) for n, s in specs.items()}
    seeds = {n: s.seed for n, s in specs.items()}
    maxl = {n: s.max_length for n, s in specs.items()}
    mesh = common.single_device_mesh()
    sizes = dataclasses.replace(tp.FULL, repeats=int(sys.argv[1]))
    for v in sys.argv[2:]:
        packed, w, mix = v.split("-")
        var = tp.Variant(mix == "3src", packed == "packed", int(w[1:]))
        names = list(specs) if var.mixture else ["web"]
        weights = {n: common.MIXTURE_WEIGHTS[n] for n in names} if var.mixture else None
        r = tp.measure_variant(var, {n: files[n] for n in names}, weights, seeds, maxl, sizes, mesh)
        t = {k: round(x["median"] / 1e6, 2) for k, x in r["tokens_per_sec"].items()}
        print(var.name, t, "ours/grain", {k: round(x, 2) for k, x in r["ours_over_grain"].items() if k in ("median", "min", "max")}, flush=True)
    
if __name__ == '__main__':
    main()
