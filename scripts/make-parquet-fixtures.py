#!/usr/bin/env python3
"""Writes the Parquet prompt files the runtime's data tests read (tests/fixtures/data/).

Needs pyarrow (a private venv is enough; CI does not run this, the files are committed):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install pyarrow
    /tmp/venv/bin/python scripts/make-parquet-fixtures.py
Snappy compression, as Hugging Face datasets ship.
"""
import pathlib

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
