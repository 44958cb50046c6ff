#!/usr/bin/env python3
"""gguf_types: prints a GGUF file's tensors as "name type" lines (GGML's
type names), then "general.file_type N" — what check_llamacpp_mix.sh
compares.  Reads only the header (no numpy, no data).

    scripts/bench/gguf_types.py FILE
"""
import struct
import sys

# GGML's type names by id (ggml.h's enum ggml_type; retired ids absent)
TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
         9: "q8_1", 10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K",
         15: "q8_K", 16: "iq2_xxs", 17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s",
         20: "iq4_nl", 21: "iq3_s", 22: "iq2_s", 23: "iq4_xs", 24: "i8", 25: "i16",
         26: "i32", 27: "i64", 28: "f64", 29: "iq1_m", 30: "bf16", 34: "tq1_0",
         35: "tq2_0", 39: "mxfp4"}
# GGUF value types: fixed sizes (8 string, 9 array)
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
INTS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 7: "?", 10: "Q", 11: "q"}


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        n = struct.calcsize(fmt)
        b = self.f.read(n)
        if len(b) != n:
            sys.exit("gguf_types: truncated file")
        return struct.unpack("<" + fmt, b)[0]

    def string(self):
        return self.f.read(self.take("Q")).decode("utf-8", "replace")

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            for _ in range(n):
                self.value(et)
            return None
        if t in INTS:
            return self.take(INTS[t])
        if t not in SIZES:
            sys.exit("gguf_types: unknown value type %d" % t)
        self.f.read(SIZES[t])
        return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], "rb") as f:
        r = Reader(f)
        if f.read(4) != b"GGUF":
            sys.exit("gguf_types: %s: not a GGUF file" % sys.argv[1])
        r.take("I")  # version
        n_tensors, n_kv = r.take("Q"), r.take("Q")
        ftype = None
        for _ in range(n_kv):
            key = r.string()
            v = r.value(r.take("I"))
            if key == "general.file_type":
                ftype = v
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.take("I")
            for _ in range(n_dims):
                r.take("Q")
            t = r.take("I")
            r.take("Q")  # offset
            print(name, TYPES.get(t, "type%d" % t))
        print("general.file_type", ftype)


main()
