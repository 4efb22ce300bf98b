"""Raw corpora to tokenized ArrayRecord shards with a lengths index.

The flow: `inputs` finds the input files and reads their documents (text,
JSON lines, Parquet, Arrow, token arrays; compressed or not), `tokenize`
turns each input part into token ids, `shards` assigns the documents to
output shards (and a held-out split) as a pure function of the inputs and
settings, `steps` are the four steps of a preparation, which `corpus` runs
locally and `beam` as an Apache Beam pipeline. `index_shards` writes the
index for ArrayRecord shards made elsewhere.
"""
