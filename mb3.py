import timeit, grain
from bench import common, throughput as tp
from xlstm_data.sources import ArrayRecordSource
class Docs(grain.MapDataset):
    def __init__(self, source):
        super().__init__()
        self._source = source
    def __len__(self):
        return len(self._source)
    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._source[index % len(self._source)]
def main():
    common.ensure_flags_parsed()
    files = common.prepare_corpus(common.lognormal_corpus(False)["web"])
    src = ArrayRecordSource(files)
    cands = {"ours map": grain.MapDataset.source(src), "custom": Docs(src),
             "grain map": grain.MapDataset.source(grain.sources.ArrayRecordDataSource(files)).map(tp.DecodeTokens())}
    for r in range(3):
        for name, ds in cands.items():
            f = lambda: [ds[i] for i in range(3000)]
            print(name, round(min(timeit.repeat(f, number=1, repeat=5)) / 3000 * 1e6, 2), end=" | ")
        print()
    it = iter(Docs(src).shuffle(seed=1).repeat(None).to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(2)))
    print(next(it)["tokens"][:3]); it.close()
if __name__ == "__main__":
    main()
