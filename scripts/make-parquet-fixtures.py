#!/usr/bin/env python3
"""Writes the Parquet prompt files the runtime's data tests read (tests/fixtures/data/).

Needs pyarrow (and `datasets` for the repository layout; a private venv is enough; CI does not
run this, the files are committed):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install pyarrow datasets
    /tmp/venv/bin/python scripts/make-parquet-fixtures.py
Snappy compression, as Hugging Face datasets ship, for the first three files; then one file per
other codec, a file of many row groups, a codec miles cannot read (LZO, patched into the footer:
no writer makes one) and a `datasets` repository layout of zstd shards (docs/data.md).
"""
import pathlib
import shutil

import pyarrow as pa
import pyarrow.parquet as pq

out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "data"
out.mkdir(parents=True, exist_ok=True)

prompts = pa.table(
    {
        "prompt": ["What is 6 times 7?", "Reverse 'abc'.", "2+2="],
        "answer": ["42", "cba", "4"],
        "level": [1, 2, 1],
        "tags": [["arith", "easy"], ["strings"], []],
    }
)
pq.write_table(prompts, out / "prompts.parquet", compression="snappy")

message = pa.struct([("role", pa.string()), ("content", pa.string())])
chat = pa.table(
    {
        "messages": pa.array(
            [
                [
                    {"role": "system", "content": "Answer with a number."},
                    {"role": "user", "content": "What is 6 times 7?"},
                ],
                [{"role": "user", "content": "2+2="}],
            ],
            type=pa.list_(message),
        ),
        "answer": ["42", "4"],
    }
)
pq.write_table(chat, out / "chat.parquet", compression="snappy")

pq.write_table(prompts.slice(0, 0), out / "empty.parquet", compression="snappy")

# The same table in each other codec pyarrow writes (lz4 is LZ4_RAW in the file).
codecs = out / "codecs"
codecs.mkdir(exist_ok=True)
for codec in ["zstd", "gzip", "lz4", "brotli"]:
    pq.write_table(prompts, codecs / f"{codec}.parquet", compression=codec)

# LZO: in the format, read by no reader miles has, written by no pyarrow. An uncompressed file
# whose footer says LZO for the prompt column: ColumnMetaData field 4 (codec, an i32 in thrift's
# compact protocol: header 0x15, zigzag varint) follows path_in_schema, a one-string list (0x18).
plain = codecs / "uncompressed.parquet"
pq.write_table(prompts.select(["prompt", "answer"]), plain, compression="none")
data = plain.read_bytes()
plain.unlink()
marker = b"\x18\x06prompt\x15\x00"
assert data.count(marker) == 1, "the footer layout changed: find the codec field by hand"
data = data.replace(marker, b"\x18\x06prompt\x15\x06")  # 3 = LZO, zigzag 6
(codecs / "lzo.parquet").write_bytes(data)

# Many row groups: 50 rows in groups of 8 (7 groups, the last of 2), read in order.
n = 50
pq.write_table(
    pa.table({"prompt": [f"{i}+{i}=" for i in range(n)], "answer": [str(2 * i) for i in range(n)], "row": list(range(n))}),
    out / "row-groups.parquet",
    compression="zstd",
    row_group_size=8,
)

# A `datasets` repository as `push_to_hub` lays it out: data/{split}-NNNNN-of-NNNNN.parquet, one
# `Dataset.shard` per file with the features in the schema's `huggingface` metadata, as
# `Dataset.to_parquet` writes them, but zstd-compressed (to_parquet pins snappy per column).
# Additions with one digit each, string prompts: a character tokenizer reads them.
import datasets  # noqa: E402

repo = out / "hf-dataset"
shutil.rmtree(repo, ignore_errors=True)
(repo / "data").mkdir(parents=True)
(repo / "README.md").write_text(
    "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n"
    "  - split: test\n    path: data/test-*\n---\nAdditions of one digit (miles' test fixture).\n"
)
pairs = [(a, b) for a in range(10) for b in range(10)]
train_pairs, test_pairs = pairs[:24], pairs[90:96]


def rows(ps, split):
    return {
        "question": [f"{a}+{b}=" for a, b in ps],
        "answer": [str(a + b) for a, b in ps],
        "id": [f"{split}-{i}" for i in range(len(ps))],
    }


train = datasets.Dataset.from_dict(rows(train_pairs, "train"))
test = datasets.Dataset.from_dict(rows(test_pairs, "test"))
for split, ds, shards in [("train", train, 3), ("test", test, 1)]:
    for i in range(shards):
        shard = ds.shard(num_shards=shards, index=i, contiguous=True)
        table = shard.with_format("arrow")[:]
        assert b"huggingface" in table.schema.metadata
        pq.write_table(table, repo / "data" / f"{split}-{i:05d}-of-{shards:05d}.parquet", compression="zstd")
