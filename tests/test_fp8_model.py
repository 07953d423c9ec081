"""benchmarks/probes/fp8_products_model.py: the e4m3-products accuracy model runs on the CPU
and orders its cases as rounding theory says (a test of the probe, not of a kernel)."""

import json


def test_the_model_runs_and_more_e4m3_terms_mean_less_error(tmp_path, import_script):
    model = import_script("fp8_products_model")
    assert model.main([str(tmp_path), "--tokens", "512", "--heads", "16", "--rows", "2"]) == 0
    found = json.loads((tmp_path / "fp8_products_model.json").read_text())
    rows = {(r["case"], r["p_scale"], r["p_sum"]): r for r in found}
    assert rows[("exact products", None, "-")]["out_rel_l2"] == 0.0
    one = rows[("q per row_head", 256.0, "float32")]["out_rel_l2"]
    two_q = rows[("q per row_head, two terms", 256.0, "float32")]["out_rel_l2"]
    two_both = rows[("q per row_head, two terms", 256.0, "split")]["out_rel_l2"]
    # One e4m3 term keeps 3 mantissa bits (relative rounding up to 2^-4); the second term's
    # rounding is of the first's remainder.
    assert 1e-3 < one < 0.1 and two_q < one / 2 and two_both < two_q / 4
