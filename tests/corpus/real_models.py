"""The real-model corpus: architectures built by the libraries people export from.

Every entry builds its model with the library's own code (Hugging Face transformers, timm,
torchvision's Python models) from a tiny config with random weights — nothing is downloaded and
nothing here re-implements a model. ``build(name)`` gives a :class:`RealCase`: the model in eval
mode, example inputs, fresh inputs of other sizes, and the ``dynamic_shapes`` spec that makes the
batch (and, for sequences, the sequence length) dynamic.

torchvision from the package index is a CUDA build that cannot load its C++ ops beside torch's
CPU build; :mod:`corpus._torchvision_ops` declares the two operator schemas its Python package
registers fake kernels for, so the Python side (models, ``ops.misc``) imports. transformers and
timm import torchvision when it is installed, so every test goes through that module first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from corpus import _torchvision_ops  # noqa: F401  (before transformers / timm import torchvision)

# families (the list): every family has at least one fresh-process run in the tests
DECODER = "decoder-llm"
ENCODER = "encoder"
SEQ2SEQ = "encoder-decoder"
SPEECH = "speech"
VIT = "vision-transformer"
CONVNET = "convnet"
SEGMENTATION = "segmentation"
AUDIO = "audio"
TIMM = "timm"
TORCHVISION = "torchvision"

VOCAB = 128
BATCH, SEQ = 2, 8


@dataclass(frozen=True)
class RealSpec:
    """How to build one corpus model and its inputs."""

    name: str
    family: str
    make_model: Callable[[], torch.nn.Module]
    # (batch, seq, seed) -> kwargs of forward
    make_inputs: Callable[[int, int, int], dict[str, Any]]
    # input name -> {dim: "batch" | "seq"}; the dims the dynamic export marks
    dims: dict[str, dict[int, str]] = field(default_factory=dict)
    seq_range: tuple[int, int] = (2, 32)
    # a second (batch, seq) the fresh-input checks use; None = the example's own sizes
    fresh: tuple[int, int] | None = (3, 5)
    note: str = ""


@dataclass
class RealCase:
    spec: RealSpec
    model: torch.nn.Module
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.spec.name

    def inputs(self, batch: int, seq: int, seed: int) -> dict[str, Any]:
        return self.spec.make_inputs(batch, seq, seed)

    def fresh_inputs(self, seed: int = 1) -> dict[str, Any]:
        if self.spec.fresh is None:
            return self.spec.make_inputs(BATCH, SEQ, seed)
        return self.spec.make_inputs(*self.spec.fresh, seed)

    def dynamic_shapes(self) -> dict[str, Any] | None:
        """The ``dynamic_shapes`` spec (torch.export's Dim objects)."""
        if not self.spec.dims:
            return None
        from torch.export import Dim

        lo, hi = self.spec.seq_range
        named = {
            "batch": Dim("batch", min=1, max=16),
            "seq": Dim("seq", min=lo, max=hi),
            "dseq": Dim("dseq", min=1, max=hi),
        }
        return {
            name: ({d: named[k] for d, k in self.spec.dims[name].items()}
                   if name in self.spec.dims else None)
            for name in self.kwargs
        }


def build(name: str, seed: int = 0) -> RealCase:
    spec = SPECS[name]
    torch.manual_seed(seed)
    model = spec.make_model().eval()
    return RealCase(spec, model, spec.make_inputs(BATCH, SEQ, seed))


# --- inputs --------------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + seed)


def _ids(batch: int, seq: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    # token 0 is often the pad id; keep it out so masks built from ids stay full
    return torch.randint(1, vocab, (batch, seq), generator=_gen(seed))


def text_inputs(mask: bool = True, token_types: bool = False) -> Callable:
    def make(batch: int, seq: int, seed: int) -> dict[str, Any]:
        out: dict[str, Any] = {"input_ids": _ids(batch, seq, seed)}
        if mask:
            out["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
        if token_types:
            out["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
        return out

    return make


TEXT_DIMS = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
TEXT_DIMS_TT = {**TEXT_DIMS, "token_type_ids": {0: "batch", 1: "seq"}}


def seq2seq_inputs(batch: int, seq: int, seed: int) -> dict[str, Any]:
    return {
        "input_ids": _ids(batch, seq, seed),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "decoder_input_ids": _ids(batch, max(seq // 2, 2), seed + 7),
    }



# the decoder's length follows the encoder's in the examples (seq // 2) but is its own dim
SEQ2SEQ_DIMS = {
    "input_ids": {0: "batch", 1: "seq"},
    "attention_mask": {0: "batch", 1: "seq"},
    "decoder_input_ids": {0: "batch", 1: "dseq"},
}


def image_inputs(size: int, channels: int = 3, name: str = "pixel_values") -> Callable:
    def make(batch: int, seq: int, seed: int) -> dict[str, Any]:
        return {name: torch.randn(batch, channels, size, size, generator=_gen(seed))}

    return make


def image_dims(name: str = "pixel_values") -> dict[str, dict[int, str]]:
    return {name: {0: "batch"}}


def wave_inputs(samples: int) -> Callable:
    def make(batch: int, seq: int, seed: int) -> dict[str, Any]:
        return {"input_values": torch.randn(batch, samples, generator=_gen(seed))}

    return make


def features_inputs(name: str, bins: int, frames: int, time_major: bool = False) -> Callable:
    def make(batch: int, seq: int, seed: int) -> dict[str, Any]:
        shape = (batch, frames, bins) if time_major else (batch, bins, frames)
        return {name: torch.randn(*shape, generator=_gen(seed))}

    return make


# --- transformers --------------------------------------------------------------------------


def _tf() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


TINY_TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def hf(config: str, model: str, **overrides: Any) -> Callable[[], torch.nn.Module]:
    """A transformers model class built from its config class with tiny sizes."""

    def make() -> torch.nn.Module:
        tf = _tf()
        kw = {**overrides}
        base = kw.pop("_base", TINY_TEXT)
        cfg = getattr(tf, config)(**{**base, **kw})
        cfg.use_cache = getattr(cfg, "use_cache", False) and False
        return getattr(tf, model)(cfg)

    return make


def hf_kwargs(config: str, model: str, **cfg: Any) -> Callable[[], torch.nn.Module]:
    """Like :func:`hf` with no tiny-text defaults (vision / audio configs name sizes
    differently)."""
    return hf(config, model, _base={}, **cfg)


LLM = {"num_key_value_heads": 2, "tie_word_embeddings": False}


def _static_cache_lm(config: str, model: str, **cfg: Any) -> Callable[[], torch.nn.Module]:
    """transformers' own ExecuTorch export wrapper: a decoder LM with a static KV cache held in
    registered buffers, one forward per step (``input_ids`` of the step's tokens)."""

    def make() -> torch.nn.Module:
        tf = _tf()
        from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

        c = getattr(tf, config)(**{**TINY_TEXT, **cfg})
        c.use_cache = True
        lm = getattr(tf, model)(c).eval()
        lm.generation_config.cache_implementation = "static"
        lm.generation_config.cache_config = {"batch_size": 1, "max_cache_len": 32}
        # what the wrapper's own ``export()`` hands to torch.export: its static-cache module
        wrapper = TorchExportableModuleForDecoderOnlyLM(lm, batch_size=1, max_cache_len=32)
        return _StepWrapper(wrapper.model)

    return make


class _StepWrapper(torch.nn.Module):
    """Gives the wrapper's ``forward(input_ids=, cache_position=)`` fixed keyword inputs."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=input_ids, cache_position=cache_position)


def _step_inputs(batch: int, seq: int, seed: int) -> dict[str, Any]:
    return {"input_ids": _ids(1, seq, seed), "cache_position": torch.arange(seq)}


_SPECS: list[RealSpec] = [
    # decoder LLMs: dense, grouped-query, sliding-window, mixture-of-experts, static cache
    RealSpec("llama", DECODER, hf("LlamaConfig", "LlamaForCausalLM", **LLM), text_inputs(), TEXT_DIMS),
    RealSpec("mistral", DECODER, hf("MistralConfig", "MistralForCausalLM", sliding_window=4, **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("qwen2", DECODER, hf("Qwen2Config", "Qwen2ForCausalLM", **LLM), text_inputs(), TEXT_DIMS),
    RealSpec("qwen3", DECODER, hf("Qwen3Config", "Qwen3ForCausalLM", head_dim=8, **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("phi3", DECODER, hf("Phi3Config", "Phi3ForCausalLM", pad_token_id=0, **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("phi", DECODER, hf("PhiConfig", "PhiForCausalLM", **LLM), text_inputs(), TEXT_DIMS),
    RealSpec("gemma", DECODER, hf("GemmaConfig", "GemmaForCausalLM", head_dim=8, **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("gemma2", DECODER, hf("Gemma2Config", "Gemma2ForCausalLM", head_dim=8, sliding_window=4,
                                   **LLM), text_inputs(), TEXT_DIMS),
    RealSpec("gemma3_text", DECODER, hf("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8,
                                        sliding_window=4, **LLM), text_inputs(), TEXT_DIMS),
    RealSpec("gpt2", DECODER, hf("GPT2Config", "GPT2LMHeadModel", _base={},
                                 vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
             text_inputs(), TEXT_DIMS),
    RealSpec("gpt_neox", DECODER, hf("GPTNeoXConfig", "GPTNeoXForCausalLM"), text_inputs(), TEXT_DIMS),
    RealSpec("opt", DECODER, hf("OPTConfig", "OPTForCausalLM", ffn_dim=64, word_embed_proj_dim=32),
             text_inputs(), TEXT_DIMS),
    RealSpec("bloom", DECODER, hf("BloomConfig", "BloomForCausalLM", _base={}, vocab_size=VOCAB,
                                  hidden_size=32, n_layer=2, n_head=4), text_inputs(), TEXT_DIMS),
    RealSpec("falcon", DECODER, hf("FalconConfig", "FalconForCausalLM"), text_inputs(), TEXT_DIMS),
    RealSpec("starcoder2", DECODER, hf("Starcoder2Config", "Starcoder2ForCausalLM", **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("olmo2", DECODER, hf("Olmo2Config", "Olmo2ForCausalLM", **LLM), text_inputs(), TEXT_DIMS),
    RealSpec("stablelm", DECODER, hf("StableLmConfig", "StableLmForCausalLM", **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("granite", DECODER, hf("GraniteConfig", "GraniteForCausalLM", **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("gptj", DECODER, hf("GPTJConfig", "GPTJForCausalLM", _base={}, vocab_size=VOCAB,
                                 n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4),
             text_inputs(), TEXT_DIMS),
    RealSpec("codegen", DECODER, hf("CodeGenConfig", "CodeGenForCausalLM", _base={},
                                    vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                    n_positions=64, n_ctx=64, rotary_dim=4),
             text_inputs(), TEXT_DIMS),
    RealSpec("mixtral", DECODER, hf("MixtralConfig", "MixtralForCausalLM", num_local_experts=4,
                                    num_experts_per_tok=2, **LLM), text_inputs(), TEXT_DIMS),
    RealSpec("qwen2_moe", DECODER, hf("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=32, **LLM),
             text_inputs(), TEXT_DIMS),
    RealSpec("llama_static_cache", DECODER, _static_cache_lm("LlamaConfig", "LlamaForCausalLM", **LLM),
             _step_inputs, {"input_ids": {1: "seq"}, "cache_position": {0: "seq"}},
             seq_range=(2, 16), fresh=(1, 5),
             note="transformers.integrations.executorch.TorchExportableModuleForDecoderOnlyLM"),
    # encoders
    RealSpec("bert", ENCODER, hf("BertConfig", "BertModel"), text_inputs(token_types=True),
             TEXT_DIMS_TT),
    RealSpec("distilbert", ENCODER, hf("DistilBertConfig", "DistilBertModel", _base={},
                                       vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                       hidden_dim=64, max_position_embeddings=64),
             text_inputs(), TEXT_DIMS),
    RealSpec("albert", ENCODER, hf("AlbertConfig", "AlbertModel", embedding_size=16),
             text_inputs(token_types=True), TEXT_DIMS_TT),
    RealSpec("roberta", ENCODER, hf("RobertaConfig", "RobertaModel"), text_inputs(), TEXT_DIMS),
    RealSpec("electra", ENCODER, hf("ElectraConfig", "ElectraModel", embedding_size=16),
             text_inputs(), TEXT_DIMS),
    RealSpec("deberta_v2", ENCODER, hf("DebertaV2Config", "DebertaV2Model"), text_inputs(), TEXT_DIMS),
    RealSpec("xlm_roberta", ENCODER, hf("XLMRobertaConfig", "XLMRobertaModel"), text_inputs(),
             TEXT_DIMS),
    RealSpec("mpnet", ENCODER, hf("MPNetConfig", "MPNetModel"), text_inputs(), TEXT_DIMS),
    RealSpec("modernbert", ENCODER, hf("ModernBertConfig", "ModernBertModel", global_attn_every_n_layers=2, pad_token_id=0,
                                       bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                       local_attention=8), text_inputs(), TEXT_DIMS),
    RealSpec("mobilebert", ENCODER, hf("MobileBertConfig", "MobileBertModel", embedding_size=16,
                                       intra_bottleneck_size=16, num_feedforward_networks=1),
             text_inputs(), TEXT_DIMS),
    RealSpec("bert_classifier", ENCODER, hf("BertConfig", "BertForSequenceClassification", num_labels=3),
             text_inputs(), TEXT_DIMS),
    # encoder-decoders (text)
    RealSpec("t5_encoder", SEQ2SEQ, hf("T5Config", "T5EncoderModel", _base={}, vocab_size=VOCAB,
                                       d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4),
             text_inputs(), TEXT_DIMS),
    RealSpec("t5", SEQ2SEQ, hf("T5Config", "T5ForConditionalGeneration", _base={}, vocab_size=VOCAB,
                               d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                               decoder_start_token_id=0), seq2seq_inputs, SEQ2SEQ_DIMS),
    RealSpec("bart", SEQ2SEQ, hf("BartConfig", "BartForConditionalGeneration", _base={},
                                 vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=4, decoder_attention_heads=4,
                                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64),
             seq2seq_inputs, SEQ2SEQ_DIMS),
    RealSpec("marian", SEQ2SEQ, hf("MarianConfig", "MarianMTModel", _base={}, vocab_size=VOCAB,
                                   d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4,
                                   encoder_ffn_dim=64, decoder_ffn_dim=64,
                                   max_position_embeddings=64, pad_token_id=0,
                                   decoder_start_token_id=0), seq2seq_inputs, SEQ2SEQ_DIMS),
    RealSpec("pegasus", SEQ2SEQ, hf("PegasusConfig", "PegasusForConditionalGeneration", _base={},
                                    vocab_size=VOCAB, d_model=32, encoder_layers=2,
                                    decoder_layers=2, encoder_attention_heads=4,
                                    decoder_attention_heads=4, encoder_ffn_dim=64,
                                    decoder_ffn_dim=64, max_position_embeddings=64),
             seq2seq_inputs, SEQ2SEQ_DIMS),
    # speech
    RealSpec("whisper", SPEECH, hf("WhisperConfig", "WhisperForConditionalGeneration", _base={},
                                   vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4,
                                   encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                                   max_source_positions=16, max_target_positions=32,
                                   decoder_start_token_id=1, pad_token_id=0),
             lambda b, s, seed: {
                 **features_inputs("input_features", 16, 32)(b, s, seed),
                 "decoder_input_ids": _ids(b, 4, seed + 3),
             }, {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch"}}),
    RealSpec("speech_to_text", SPEECH, hf("Speech2TextConfig", "Speech2TextForConditionalGeneration",
                                          _base={}, vocab_size=VOCAB, d_model=32, encoder_layers=2,
                                          decoder_layers=2, encoder_attention_heads=4,
                                          decoder_attention_heads=4, encoder_ffn_dim=64,
                                          decoder_ffn_dim=64, input_feat_per_channel=16,
                                          max_source_positions=64, max_target_positions=32,
                                          conv_channels=32, decoder_start_token_id=1),
             lambda b, s, seed: {
                 **features_inputs("input_features", 16, 16, time_major=True)(b, s, seed),
                 "decoder_input_ids": _ids(b, 4, seed + 3),
             }, {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch"}}),
    # audio encoders
    RealSpec("wav2vec2", AUDIO, hf("Wav2Vec2Config", "Wav2Vec2Model", conv_dim=(16, 16),
                                   conv_stride=(5, 2), conv_kernel=(10, 3),
                                   num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                   do_stable_layer_norm=True, feat_extract_norm="layer"),
             wave_inputs(400), {"input_values": {0: "batch"}}),
    RealSpec("hubert", AUDIO, hf("HubertConfig", "HubertModel", conv_dim=(16, 16),
                                 conv_stride=(5, 2), conv_kernel=(10, 3),
                                 num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
             wave_inputs(400), {"input_values": {0: "batch"}}),
    RealSpec("audio_spectrogram_transformer", AUDIO,
             hf("ASTConfig", "ASTModel", num_mel_bins=16, max_length=32, patch_size=8,
                frequency_stride=8, time_stride=8),
             features_inputs("input_values", 16, 32, time_major=True), {"input_values": {0: "batch"}}),
    # vision transformers
    RealSpec("vit", VIT, hf("ViTConfig", "ViTModel", image_size=32, patch_size=8),
             image_inputs(32), image_dims()),
    RealSpec("deit", VIT, hf("DeiTConfig", "DeiTModel", image_size=32, patch_size=8),
             image_inputs(32), image_dims()),
    RealSpec("beit", VIT, hf("BeitConfig", "BeitModel", image_size=32, patch_size=8,
                             use_relative_position_bias=True), image_inputs(32), image_dims()),
    RealSpec("dinov2", VIT, hf("Dinov2Config", "Dinov2Model", image_size=32, patch_size=8),
             image_inputs(32), image_dims()),
    RealSpec("swin", VIT, hf_kwargs("SwinConfig", "SwinModel", image_size=32, patch_size=2,
                                    embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
             image_inputs(32), image_dims()),
    RealSpec("clip_vision", VIT, hf("CLIPVisionConfig", "CLIPVisionModel", image_size=32, patch_size=8),
             image_inputs(32), image_dims()),
    RealSpec("siglip_vision", VIT, hf("SiglipVisionConfig", "SiglipVisionModel", image_size=32,
                                      patch_size=8), image_inputs(32), image_dims()),
    # convnets
    RealSpec("hf_resnet", CONVNET, hf_kwargs("ResNetConfig", "ResNetModel", embedding_size=8,
                                             hidden_sizes=[8, 16], depths=[1, 1]),
             image_inputs(32), image_dims()),
    RealSpec("hf_convnext", CONVNET, hf_kwargs("ConvNextConfig", "ConvNextModel", hidden_sizes=[8, 16],
                                               depths=[1, 1], num_stages=2),
             image_inputs(32), image_dims()),
    RealSpec("hf_mobilenet_v2", CONVNET, hf_kwargs("MobileNetV2Config", "MobileNetV2Model",
                                                   image_size=32, depth_multiplier=0.25),
             image_inputs(32), image_dims()),
    RealSpec("hf_regnet", CONVNET, hf_kwargs("RegNetConfig", "RegNetModel", embedding_size=8,
                                             hidden_sizes=[8, 16], depths=[1, 1], groups_width=8),
             image_inputs(32), image_dims()),
    # segmentation
    RealSpec("segformer", SEGMENTATION, hf_kwargs("SegformerConfig", "SegformerForSemanticSegmentation",
                                                  num_encoder_blocks=2, depths=[1, 1],
                                                  sr_ratios=[2, 1], hidden_sizes=[8, 16],
                                                  num_attention_heads=[1, 2], decoder_hidden_size=16,
                                                  patch_sizes=[7, 3], strides=[4, 2],
                                                  mlp_ratios=[2, 2], num_labels=3),
             image_inputs(32), image_dims()),
    RealSpec("mobilevit", SEGMENTATION, hf_kwargs("MobileViTConfig", "MobileViTForSemanticSegmentation",
                                                  image_size=32, hidden_sizes=[16, 16, 16],
                                                  neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32],
                                                  num_labels=3, aspp_out_channels=16),
             image_inputs(32), image_dims()),
]


# --- timm ------------------------------------------------------------------------------------


def timm_model(name: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    """timm's ``create_model`` with a 10-class head (unless ``kw`` says otherwise): the heads
    of 1000 classes were most of the small nets' weights."""
    def make() -> torch.nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, **{"num_classes": 10, **kw})

    return make


_TIMM = [
    # narrower than the published nets where timm takes the widths (the same layers and ops;
    # full widths made these few models a third of the real-model suites' time)
    ("timm_resnet18", "resnet18", 32, {"channels": (16, 32, 64, 128)}),
    ("timm_resnet50d", "resnet50d", 32, {"channels": (16, 32, 64, 128)}),
    ("timm_efficientnet_b0", "efficientnet_b0", 32, {}),
    ("timm_mobilenetv3", "mobilenetv3_small_050", 32, {}),
    ("timm_convnext_atto", "convnext_atto", 32, {}),
    ("timm_vit_tiny", "vit_tiny_patch16_224", 32, {"img_size": 32, "depth": 2}),
    ("timm_deit_tiny", "deit_tiny_distilled_patch16_224", 32, {"img_size": 32, "depth": 2}),
    ("timm_swin", "swin_tiny_patch4_window7_224", 56, {"img_size": 56, "depths": (1, 1, 1, 1)}),
    ("timm_regnetx", "regnetx_002", 32, {}),
    ("timm_densenet", "densenet121", 32, {"block_config": (1, 1, 1, 1)}),
    ("timm_mixer", "mixer_s16_224", 32, {"img_size": 32}),
    ("timm_levit", "levit_128s", 64, {"img_size": 64}),
    ("timm_ghostnet", "ghostnet_050", 32, {}),
    ("timm_rexnet", "rexnet_100", 32, {}),
    ("timm_dla", "dla34", 32, {"channels": (8, 16, 16, 32, 64, 128)}),
    ("timm_mobilevit", "mobilevit_xxs", 64, {}),
    ("timm_efficientvit", "efficientvit_b0", 64, {}),
    ("timm_poolformer", "poolformer_s12", 32, {}),
    ("timm_coat", "coatnet_nano_rw_224", 64, {"img_size": 64, "embed_dim": (32, 64, 96, 128)}),
    ("timm_repvgg", "repvgg_a0", 32, {}),
]

_SPECS += [
    RealSpec(name, TIMM, timm_model(arch, **kw), image_inputs(size, name="x"), image_dims(name="x"),
             note=arch)
    for name, arch, size, kw in _TIMM
]


# --- torchvision (Python models; see the module docstring) -------------------------------------


def tv_model(name: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    """``torchvision.models.<name>(**kw)`` with a 10-class head (unless ``kw`` says otherwise)."""
    def make() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(**{"num_classes": 10, **kw})

    return make


def tv_convnext_tiny() -> torch.nn.Module:
    """torchvision's ConvNeXt in convnext_tiny's layout (3, 3, 9, 3 blocks), 1/4 the widths."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    widths, depths = (24, 48, 96, 192), (3, 3, 9, 3)
    return ConvNeXt([CNBlockConfig(w, nxt, d) for w, nxt, d in
                     zip(widths, (*widths[1:], None), depths)], stochastic_depth_prob=0.1,
                    num_classes=10)


def tv_swin_t() -> torch.nn.Module:
    """torchvision's Swin Transformer in swin_t's layout (2, 2, 6, 2 blocks, window 7), 1/3 the
    widths and heads of 32 channels."""
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2, 6, 2],
                           num_heads=[1, 2, 4, 8], window_size=[7, 7],
                           stochastic_depth_prob=0.2, num_classes=10)


_TV = [
    ("tv_convnext_tiny", tv_convnext_tiny, 32, "convnext_tiny's layout, 1/4 widths"),
    ("tv_swin_t", tv_swin_t, 32, "swin_t's layout, 1/3 widths"),
    ("tv_resnet18", tv_model("resnet18"), 32, "resnet18"),
    ("tv_mobilenet_v3", tv_model("mobilenet_v3_small"), 32, "mobilenet_v3_small"),
]

_SPECS += [
    RealSpec(name, TORCHVISION, make, image_inputs(size, name="x"), image_dims(name="x"),
             note=note)
    for name, make, size, note in _TV
]


SPECS: dict[str, RealSpec] = {s.name: s for s in _SPECS}
NAMES: list[str] = list(SPECS)

def params(names: list[str] | None = None) -> list[Any]:
    """``names`` (default: every model) as pytest parameters: each in its model's xdist group
    (the per-process caches of tests/real_models/_harness.py)."""
    import pytest

    return [pytest.param(n, id=n, marks=[pytest.mark.xdist_group(f"real-{n}")])
            for n in (NAMES if names is None else names)]


@functools.cache
def families() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in _SPECS:
        out.setdefault(s.family, []).append(s.name)
    return out
