"""GGUF import of Mamba (v1) models (llama.cpp's mamba: Falcon-Mamba, state-spaces' Mamba),
written as llama.cpp's converter (MambaModel) writes them, with the gguf package's names."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from app.engine.loader import config_model
from tests.conftest import TinyModels
from tests.engine.families import hybrid_config
from tests.fakes import assert_drafts_for_itself, finish_gguf, imported_as, tiny_tokenizer


def _mamba(falcon: bool) -> Any:
    """A tiny Mamba; Falcon-Mamba's kind norms its dt, B and C."""
    mx.random.seed(8)
    model = config_model({**hybrid_config("mamba"), "use_bcdt_rms": falcon})
    mx.eval(model.parameters())
    return model


def _write(path: Path, model: Any, tokenizer: Path, falcon: bool) -> Path:
    """MambaModel.set_gguf_parameters' keys; A as -exp(A_log), the convolution squeezed."""
    args = model.args
    layers = args.num_hidden_layers
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_name("tiny")
    w.add_context_length(2**20)
    w.add_embedding_length(args.hidden_size)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(layers)
    w.add_ssm_conv_kernel(args.conv_kernel)
    w.add_ssm_inner_size(args.intermediate_size)
    w.add_ssm_state_size(args.state_size)
    w.add_ssm_time_step_rank(args.time_step_rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_dt_b_c_rms(falcon)
    tiny_tokenizer(tokenizer)(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MAMBA, layers)
    tensors = {}
    for name, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())):
        x = np.array(value, dtype=np.float32)
        if name.endswith(".A_log"):
            x = -np.exp(x)
        elif name.endswith(".conv1d.weight"):  # MLX's (C, K, 1)
            x = x.squeeze(-1)
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        tensors[mapped] = x
    finish_gguf(w, tensors)
    return path


@pytest.mark.parametrize("falcon", [False, True], ids=["mamba", "falcon-mamba"])
def test_mamba_imports_with_the_same_logits_and_drafts_for_itself(
    falcon: bool, tiny: TinyModels, tmp_path: Path
) -> None:
    model = _mamba(falcon)
    out = tmp_path / "out"
    config = imported_as(_write(tmp_path / "mamba.gguf", model, tiny.target, falcon), out, model)
    assert config["model_type"] == "mamba"
    assert config["use_bcdt_rms"] is falcon
    assert_drafts_for_itself(out)
