"""Shared-memory wavefronts of the seesaw's in-place e4m3 -> fp16 conversion, by a quarter-warp model.

    python benchmarks/candidates/conversion_banks.py

A 16-byte access is served 8 lanes at a time; each 8-lane group takes as many wavefronts as the
most distinct addresses that fall on one 16-byte bank group. Addresses follow the NVMMA swizzles
of the kernel's buffers (128-byte rows: chunk c of row r at c ^ r % 8; the rope's 64-byte e4m3
rows: c ^ (r // 2) % 4). The committed layout (lane = 4r + j) gives 8 wavefronts for each e4m3
load of a latent half, 4 elsewhere, as Nsight Compute measured (run zz18);
`seesaw_conflict_free_convert.diff` (lane = r + 8j) gives 4 everywhere.
"""


def swz128(r, chunk):  # byte address of 16B chunk (0..7) in a 128-byte row r, 128B swizzle
    return r*128 + ((chunk ^ (r % 8)) * 16)
def swz64(r, chunk):   # 64-byte rows (e4m3 rope), 64B swizzle: XOR with (r>>1)&3
    return r*64 + ((chunk ^ ((r >> 1) & 3)) * 16)
def wavefronts(addrs):
    total = 0
    for q in range(4):
        lanes = addrs[q*8:(q+1)*8]
        groups = {}
        for a in lanes: groups.setdefault((a // 16) % 8, set()).add(a)
        total += max(len(v) for v in groups.values())
    return total
for order in ("rows within 4 lanes (old: lane = 4r + j)", "rows across lanes (new: lane = r + 8j)"):
    res = {}
    for kind in ("e4m3 half load", "fp16 store 1st chunk", "fp16 store 2nd chunk", "e4m3 rope load"):
        worst = 0
        for col_slice in range(2):          # cols 0-63 / 64-127 of a 128-col e4m3 block
            for row0 in (0, 8, 16, 24):     # warps
                addrs = []
                for lane in range(32):
                    r, j = (lane // 4, lane % 4) if order.startswith("rows within") else (lane % 8, lane // 8)
                    r += row0
                    if kind == "e4m3 half load": a = swz128(r, j + 4*col_slice)
                    elif kind == "e4m3 rope load": a = swz64(r, j)
                    else: a = swz128(r, 2*j + (kind.endswith("2nd chunk")))
                    addrs.append(a)
                worst = max(worst, wavefronts(addrs))
        res[kind] = worst
    print(order, res)
