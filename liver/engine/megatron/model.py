"""A Megatron-Core GPT model on a generation's own groups.

Megatron-Core takes its process groups explicitly (``ProcessGroupCollection``, 0.16): the model is
built over the World's tensor-, pipeline- and data-parallel groups, never over Megatron's global
``parallel_state`` (``initialize_model_parallel`` would make groups of the default group, which a
live reshape replaces). Megatron-Core is imported here and only here, on first use, with its
warnings about Transformer Engine and Apex (not used: the local layer spec) silenced.
"""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any

import torch

from liver.engine.megatron.config import GPTConfig
from liver.topology import ParallelConfig

VERSION = "0.16.1"
"""The Megatron-Core this engine is written and tested against (``liver[megatron]``)."""


class MegatronMissing(ImportError, ValueError):
    """Megatron-Core is not installed: an import error, and a user's error the commands report in
    words (``liver: error: ...``, exit 2), as a job file naming this engine without it is."""


@functools.cache
def megatron() -> types.SimpleNamespace:
    """Megatron-Core's names this engine uses; ``MegatronMissing`` saying how to install it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, ShardedTensorFactory
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
            from megatron.core.models.gpt.gpt_model import GPTModel
            from megatron.core.process_groups_config import ProcessGroupCollection
            from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError as e:
        raise MegatronMissing(f"the Megatron-Core engine needs megatron-core {VERSION}: "
                              f"pip install 'liver[megatron]' ({e})") from None
    return types.SimpleNamespace(GPTModel=GPTModel, TransformerConfig=TransformerConfig,
                                 ProcessGroupCollection=ProcessGroupCollection, layer_spec=get_gpt_layer_local_spec,
                                 ShardedTensor=ShardedTensor, ShardedTensorFactory=ShardedTensorFactory,
                                 ShardedObject=ShardedObject)


def collection(tp: Any, pp: Any, dp: Any, solo: Any, embedding: Any = None) -> Any:
    """Megatron's ``ProcessGroupCollection`` over a generation's groups: ``tp``, ``pp``, ``dp`` (torch
    ``ProcessGroup``s of this rank's axes), ``solo`` a one-member group (context parallelism is not
    used: its groups are this rank alone), ``embedding`` the first and last stages' group (a tied
    output layer's; None: not tied, or this stage is neither)."""
    pgs = megatron().ProcessGroupCollection()
    pgs.tp, pgs.pp, pgs.dp, pgs.cp = tp, pp, dp, solo
    pgs.tp_cp, pgs.dp_cp = tp, dp  # (no context parallelism: these are tp's and dp's)
    pgs.embd = embedding
    pgs.pos_embd = None  # (RoPE: no position embedding to tie)
    return pgs


def world_collection(world: Any) -> Any:
    """``collection`` over a LiveR ``World``'s own groups (a one-member group made where an axis has
    one member, and for context parallelism)."""
    return collection(world.process_group("tp"), world.process_group("pp"), world.process_group("dp"),
                      world.solo_process_group("megatron-cp"))


def gpt(config: GPTConfig, parallel: ParallelConfig, split: list[int], stage: int, pgs: Any,
        dtype: torch.dtype = torch.float32, **extra: Any) -> torch.nn.Module:
    """Stage ``stage`` of ``config``'s GPT model under ``parallel`` (``split``: each stage's layers)
    on the groups of ``pgs``, its tensors on the current device (``torch.device("meta")`` as a
    context: no storage); ``extra``: more fields of Megatron's ``TransformerConfig``. The output layer
    gives whole logits (``parallel_output=False``: Megatron's vocab-parallel loss reads its global
    TP group, which this engine does not set); the engine takes the loss of them."""
    m = megatron()
    tc = config.transformer_config(parallel, split, dtype, **extra)
    with warnings.catch_warnings():  # (its layer spec's own deprecations, once a module)
        warnings.simplefilter("ignore", DeprecationWarning)
        model = m.GPTModel(tc, m.layer_spec(normalization="RMSNorm"), vocab_size=config.vocab_size,
                           max_sequence_length=config.seq_length, pre_process=stage == 0,
                           post_process=stage == parallel.pp - 1, position_embedding_type="rope",
                           share_embeddings_and_output_weights=False, pg_collection=pgs,
                           parallel_output=False)
    mark_tensor_parallel(model)
    return model


def mark_tensor_parallel(model: torch.nn.Module) -> None:
    """Megatron marks a weight it cuts over TP (``tensor_model_parallel``, its dimension and
    stride: what its gradient norm, its optimizer and its checkpoints read) only where it
    initialises it (``perform_initialization``); a model built to be loaded, as every engine after
    a handoff or a restart is, gets the marks its initialisation would have given, and every other
    parameter Megatron's defaults (not cut)."""
    from megatron.core.tensor_parallel import layers
    from megatron.core.transformer.mlp import MLP

    # a gated MLP's first weight holds each rank's [gate, up] halves: stride 2 (megatron/core/transformer/mlp.py)
    strided = {id(m.linear_fc1.weight) for m in model.modules()
               if isinstance(m, MLP) and m.config.gated_linear_unit and not m.config.use_kitchen}
    for mod in model.modules():
        dim = 0 if isinstance(mod, (layers.ColumnParallelLinear, layers.VocabParallelEmbedding)) else \
            1 if isinstance(mod, layers.RowParallelLinear) else None
        w = getattr(mod, "weight", None)
        if dim is not None and isinstance(w, torch.nn.Parameter) and not hasattr(w, "tensor_model_parallel"):
            layers.set_tensor_model_parallel_attributes(w, True, dim, 2 if id(w) in strided else 1)
    for p in model.parameters():
        layers.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
