"""Why the first piece of `seesaw_split_other_half.diff` needs no barrier, by a byte model.

    python benchmarks/candidates/split_layout_check.py

A latent half's fp16 buffer [64 tokens, 256 columns] under the 128-byte swizzle is four blocks of
64 columns, 8 KiB each (64 rows of 128 bytes; chunk c of row r at c ^ r % 8). The e4m3 copy lands in
its upper 16 KiB as two blocks of 128 columns (the e4m3 build's PTX from `scripts/gluon_compile.py
OUT`, Triton 3.6: each half's copy is two boxes, from two issuing threads i = 0, 1, to byte
(i << 13) + 16384 of the buffer and from column i << 7). The model checks, for every
byte: piece 1 (fp16 columns 0-127) writes no byte of the e4m3 copy, so its loads and stores need no
barrier between them; piece 2 (columns 128-255) overwrites only e4m3 bytes of columns that piece 1
or piece 2 itself has loaded, so one barrier between piece 2's loads and stores suffices.
"""


def fp16_bytes(row, col):
    block, c, within = col // 64, (col % 64) // 8, (col % 8) * 2
    base = block * 8192 + row * 128 + ((c ^ (row % 8)) * 16) + within
    return {base, base + 1}


def e4m3_byte(row, col):
    block, c, within = col // 128, (col % 128) // 16, col % 16
    return 16384 + block * 8192 + row * 128 + ((c ^ (row % 8)) * 16) + within


rows = range(64)
e4m3_owner = {e4m3_byte(r, c): c for r in rows for c in range(256)}
assert len(e4m3_owner) == 64 * 256 and min(e4m3_owner) == 16384 and max(e4m3_owner) == 32767
written = [set().union(*(fp16_bytes(r, c) for r in rows for c in cols)) for cols in (range(128), range(128, 256))]
assert written[0] == set(range(16384)), "piece 1 fills exactly the lower 16 KiB"
assert not written[0] & set(e4m3_owner), "piece 1 writes no e4m3 byte: no barrier needed"
clobbered_columns = {e4m3_owner[b] for b in written[1] if b in e4m3_owner}
assert clobbered_columns == set(range(256)), "piece 2 overwrites the whole e4m3 copy"
print("piece 1: writes bytes 0-16383, none of the e4m3 copy (16384-32767): no barrier between its loads and stores")
print("piece 2: overwrites e4m3 columns 0-255; 0-127 were loaded by piece 1 (before its closing barrier),"
      " 128-255 by piece 2 itself (before its barrier)")
