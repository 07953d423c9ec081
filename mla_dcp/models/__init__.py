"""Real model code driven through mla_dcp: :mod:`mla_dcp.models.hf` (Hugging
Face DeepSeek-V2/V3 and Kimi-K2; needs the ``hf`` extra, imported on use)."""
