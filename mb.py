import timeit, grain, numpy as np
from bench import common, throughput as tp
from xlstm_data.sources import ArrayRecordSource
def main():
    common.ensure_flags_parsed()
    files = common.prepare_corpus(common.lognormal_corpus(False)["web"])
    ours = ArrayRecordSource(files)
    raw = grain.sources.ArrayRecordDataSource(files)
    mo = grain.MapDataset.source(ours)
    mg = grain.MapDataset.source(raw).map(tp.DecodeTokens())
    n = 3000
    for name, f in (("ours src", lambda: [ours[i] for i in range(n)]), ("raw src", lambda: [raw[i] for i in range(n)]),
                    ("ours map", lambda: [mo[i] for i in range(n)]), ("grain map", lambda: [mg[i] for i in range(n)])):
        f()
        print(name, round(min(timeit.repeat(f, number=1, repeat=5)) / n * 1e6, 2), "us/record")
if __name__ == "__main__":
    main()
