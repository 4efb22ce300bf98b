"""Training on Megatron-LM corpora as they are: `--data-path` and end-of-document id after a colon.

    python tools/preprocess_data.py --input web.jsonl --output-prefix /data/web \\
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \\
        --append-eod          # (Megatron-LM) writes /data/web_text_document.{bin,idx}
    python -m trainer_hooks.train \\
        --config=configs/megatron.py:/data/web_text_document,50256 --workdir=run

After the colon come the words of Megatron's `--data-path`: one prefix, or
weights and prefixes in turn, quoted as one argument,
`--config='configs/megatron.py:0.7 /data/web_text_document 0.3 /data/code_text_document,50256'`.
A weighted blend is one dataset per prefix, named after its file name
(`web_text_document`); prefixes alone are one dataset, `corpus`, drawing from
each in proportion to its size, as Megatron does (`xlstm_data.megatron_datasets`).
The `.bin`/`.idx` pair is memory-mapped and read in place: nothing is
converted, tokenized or counted at launch (the `.idx` holds every length).
After the comma comes the id `--append-eod` stored after every document
(GPT-2's 50256 above): each document is read without it and packing ends it
with that id, once. For a corpus written without `--append-eod`, leave the
comma out and name the tokenizer's id: `--config.data.eod_token_id=50256`
(Megatron's files record no tokenizer, so it is refused, not guessed). A
corpus of int32 ids (tokenizers of 65,500 ids or more) also needs
`--config.data.train.corpus.vocab_size=N`. The overrides here name the
dataset of one prefix, `corpus`; for a weighted blend, name each dataset
(`--config.data.train.web_text_document.vocab_size=N`); `,EOD` goes to every
corpus of a blend, so one written without `--append-eod` needs
`--config.data.train.books_text_document.end_of_document=None`. Several corpora also
go in as a glob of their `.idx` files,
`--config.data.train.corpus.path=/data/*_text_document.idx`. To hold out
Megatron's valid part, add `--config.data.train.corpus.split=969,30,1` and an
eval dataset of the same files with the same split and `split_part: "valid"`
(`xlstm_data.megatron_datasets(words, mixed=False, split=..., split_part="valid")`
makes them for a blend, named `web_text_document_valid` and so on).
"""

from ml_collections import config_dict

from trainer_hooks.config import default_config
from xlstm_data.config.megatron_blend import megatron_datasets


def get_config(argument: str | None = None) -> config_dict.ConfigDict:
    if not argument:
        raise ValueError(
            "configs/megatron.py needs a Megatron corpus prefix after a colon (or the words of "
            "Megatron's --data-path), and the end-of-document id its documents end with after a "
            "comma when it was written with --append-eod: "
            "--config=configs/megatron.py:/data/web_text_document,50256"
        )
    data_path, comma, end = argument.rpartition(",") if "," in argument else (argument, "", "")
    if comma and not end.strip().isdigit():
        raise ValueError(
            f"configs/megatron.py:{argument}: the end-of-document id after the comma must be a "
            f"non-negative integer, not {end!r}: --config=configs/megatron.py:{data_path},50256"
        )
    config = default_config()
    config.num_train_steps = 1000
    data = config.data
    # Left out without `,EOD`, so that an override can still set it.
    options = {"end_of_document": int(end)} if end else {}
    datasets = megatron_datasets(data_path, arg="configs/megatron.py's data_path", **options)
    data.train = config_dict.ConfigDict(datasets)
    data.global_batch_size = 32
    data.max_target_length = 256
    data.rampup = [[0, 0.5], [100, 1.0]]
    return config
