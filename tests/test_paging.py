"""Stage 2 against brute force."""

import pytest
import torch

from mla_dcp import pure


def brute_force_page_table(block_table, block_size, max_local_len):
    page = 1
    while block_size % (page * 2) == 0 and page * 2 <= 128:
        page *= 2
    rows = []
    for blocks in block_table.tolist():
        row = []
        for token in range(0, max_local_len, page):
            block = blocks[token // block_size]
            row.append((block * block_size + token % block_size) // page)
        rows.append(row)
    return rows


@pytest.mark.parametrize("block_size,page", [(1, 1), (16, 16), (64, 64), (96, 32), (1536, 128), (256, 128)])
@pytest.mark.parametrize("max_local_len", [1, 100, 3001])
def test_expand_page_table_brute_force(block_size, page, max_local_len):
    assert pure.page_size_for(block_size) == page
    blocks = -(-max_local_len // block_size)
    gen = torch.Generator().manual_seed(block_size)
    table = torch.randint(0, 50, (3, blocks + 1), generator=gen, dtype=torch.int32)
    got = pure.expand_page_table(table, block_size, max_local_len)
    assert got.dtype == torch.int32
    assert got.shape == (3, -(-max_local_len // page))
    assert got.tolist() == brute_force_page_table(table, block_size, max_local_len)


def test_expanded_pages_address_the_same_slots():
    """Reading token j through pages equals reading it through blocks."""
    block_size, max_local_len = 96, 500
    cache = torch.randn(20, block_size, 4)
    table = torch.randperm(20)[:6].to(torch.int32)[None]
    pages = pure.expand_page_table(table, block_size, max_local_len)
    page = pure.page_size_for(block_size)
    paged = cache.view(-1, page, 4)
    for j in range(max_local_len):
        via_block = cache[table[0, j // block_size], j % block_size]
        via_page = paged[pages[0, j // page], j % page]
        assert torch.equal(via_block, via_page)


def test_too_narrow_block_table_is_rejected():
    with pytest.raises(ValueError, match=r"at least 2 columns"):
        pure.expand_page_table(torch.zeros(1, 1, dtype=torch.int32), 16, 17)
