import cProfile, pstats, grain
from bench import common, throughput as tp
from xlstm_data.sources import ArrayRecordSource
def main():
    common.ensure_flags_parsed()
    files = common.prepare_corpus(common.lognormal_corpus(False)["web"])
    mo = grain.MapDataset.source(ArrayRecordSource(files))
    mg = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(files)).map(tp.DecodeTokens())
    for ds in (mo, mg):
        [ds[i] for i in range(3000)]
        pr = cProfile.Profile(); pr.enable()
        [ds[i] for i in range(3000)]
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
if __name__ == "__main__":
    main()
