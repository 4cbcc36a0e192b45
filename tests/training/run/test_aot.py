"""A tiny model's programs compiled for a TPU slice on this CPU (`training.run.aot`, libtpu's compile-only devices).

On a v5e 2x2 as (data 2, model 2) the train step compiles, reports its memory a device, and has
all-reduces of activations [rows / data, L, d_model] where the model axis splits the heads (after
W^O) and the MLP (after wo); with model = 1 it has none (only the gradients' all-reduce over data).
A model no chip can hold is refused in one line. The decode step (its cache at the full decode
length, donated) and the whole beam search (one `while` a cache length) compile for one v5e chip with
no XLA:CPU barrier in them. Skipped where the libtpu wheel (the `aot` extra) is absent; the target
parsing and the HLO counting need no TPU. The same train step compiled for two H100s (the CUDA
plugin's deviceless route) holds its all-reduces and no XLA:CPU barrier, and its FLOPs a device
(XLA:CPU's count of the unoptimised module) agree with the dense layers' count.
"""

import re

import pytest

from configs import default
from models import decoding
from training.evaluation import dev
from training.run import aot

needs_cuda = pytest.mark.skipif(
    not aot.has_cuda_compiler(), reason="the CUDA plugin (the `aot` extra) or CUDA's ptxas / nvlink is absent"
)
needs_libtpu = pytest.mark.skipif(
    not aot.has_libtpu(), reason="the libtpu wheel is absent: pip install -c requirements.lock -e '.[aot]'"
)
D_MODEL, ROWS, LENGTH, VOCAB = 64, 32, 64, 256
BF16 = 2  # bytes: the model's compute dtype on a TPU (model.dtype "auto")


def _tiny():
    config = default.get_config()
    config.model.update(num_layers=1, d_model=D_MODEL, mlp_dim=128, num_heads=4, dtype="auto")
    config.data.update(vocab_size=VOCAB, token_budget=ROWS * LENGTH, pack_length=LENGTH)
    return config


def _activation_all_reduces(hlo: str, rows: int) -> int:
    """All-reduce results shaped like an activation [rows, LENGTH, D_MODEL] (a tuple's members each)."""
    shape = rf"\w+\[{rows},{LENGTH},{D_MODEL}\]"
    return sum(len(re.findall(shape, m)) for m in re.findall(r"= (\(.*?\)|\S+) all-reduce(?:-start)?\(", hlo))


@needs_libtpu
def test_tiny_train_step_on_a_v5e_slice_splits_heads_and_mlp_over_model():
    target = aot.parse_target("tpu:v5e:2x2")
    devices = aot.compile_only_devices(target)
    split = aot.compile_programs(_tiny(), target, 2, 2, programs=("train",), devices=devices, keep_hlo=True)["train"]
    assert split["mesh"] == {"data": 2, "model": 2} and split["batch"] == [ROWS, LENGTH]
    memory = split["memory_bytes"]
    assert memory["argument"] > 0 and memory["temp"] > 0 and 0 < split["hbm_share"] < 0.01
    assert split["flops"] > 0 and split["fusions"] > 0
    # forward: after W^O of the encoder's self-attention and the decoder's two, and after each MLP's wo (1 layer)
    assert _activation_all_reduces(split["hlo"], ROWS // 2) >= 3 + 2
    assert aot.refusal("train", split) is None
    data_only = aot.compile_programs(_tiny(), target, 4, 1, programs=("train",), devices=devices, keep_hlo=True)[
        "train"
    ]
    assert _activation_all_reduces(data_only["hlo"], ROWS // 4) == 0
    assert data_only["collectives"]["all-reduce"] < split["collectives"]["all-reduce"]


@needs_cuda
def test_tiny_train_step_on_two_gpus():
    config = _tiny()
    config.model.dtype = "auto"
    report = aot.compile_programs(config, aot.parse_target("cuda:h100:2"), 2, 1, programs=("train",), keep_hlo=True)[
        "train"
    ]
    assert report["mesh"] == {"data": 2, "model": 1} and report["memory_bytes"]["temp"] > 0
    assert report["collectives"]["all-reduce"] > 0 and "opt-barrier" not in report["hlo"]
    assert re.search(r"\bbf16\[", report["hlo"])  # 'auto' is bfloat16 for a GPU, not this host's choice
    # forward 2 and backward 4 FLOPs a weight a token over the kernels (encoder, decoder, the logits' d_model x
    # vocab), rows split over 2 GPUs: the dense layers' count, which attention and elementwise work exceed
    d, mlp, vocab, tokens = D_MODEL, 128, 256, ROWS * LENGTH / 2
    weights = 4 * d * d + 2 * d * mlp + 8 * d * d + 2 * d * mlp + d * vocab
    assert 6 * weights * tokens < report["flops"] < 2 * 6 * weights * tokens
    # the loss reads the targets' logits as a masked sum: no gather whose gradient scatters into [rows, L, vocab]
    # (the embeddings' gradient scatters into [vocab, d_model], as the peer's does)
    assert re.search(rf"= \w+\[{vocab},{d}\]\S* scatter\(", report["hlo"])  # the check can fail: scatters show
    assert not re.search(rf"= \w+\[\d+,{LENGTH},{vocab}\]\S* scatter\(", report["hlo"]), (
        "XLA:CPU's gather reached a GPU"
    )


@needs_libtpu
def test_a_model_no_chip_holds_is_refused_in_one_line():
    config = _tiny()  # a million-piece vocabulary at d_model 2048: 8 GiB of embedding, its logits 8 GiB more
    config.model.d_model, config.data.vocab_size = 2048, 2**20
    with pytest.raises(aot.DoesNotFit, match=r"^the train step needs \d+\.\d GiB a device \([^)]*\); a v5e has 16$"):
        aot.compile_programs(config, aot.parse_target("tpu:v5e"), programs=("train",))


@needs_libtpu
def test_tiny_decode_step_on_a_v5e_holds_its_cache_at_full_length_donated():
    config = _tiny()
    report = aot.compile_programs(config, aot.parse_target("tpu:v5e"), programs=("decode",), keep_hlo=True)["decode"]
    src_length = max(config.data.bucket_lengths)  # 128: the longest dev batch
    rows, max_len = dev.ROWS, src_length + config.eval.max_extra_length
    assert report["batch"] == [rows, src_length] and report["max_len"] == max_len and report["devices"] == 1
    # by hand: self-attention's keys and values at every output position, cross-attention's at every source position
    # (1 layer)
    cache = 2 * rows * (max_len + src_length) * D_MODEL * BF16
    memory = report["memory_bytes"]
    assert memory["argument"] >= cache + rows * src_length * D_MODEL * BF16  # + the encoded source
    assert memory["alias"] >= cache and memory["output"] >= cache + rows * VOCAB * 4  # + log-probs, float32
    # one token's matmuls: q, k, v, o of self-attention, q, o of cross, the MLP, scores and values over the
    # cache and the source, the vocabulary projection; not the T tokens of the cache's initialising pass
    matmuls = 2 * rows * (6 * D_MODEL**2 + 2 * D_MODEL * 128 + 2 * (max_len + src_length) * D_MODEL + D_MODEL * VOCAB)
    assert matmuls <= report["flops"] < 2 * matmuls
    assert 0 < report["hbm_share"] < 0.01 and "opt-barrier" not in report["hlo"]


@needs_libtpu
def test_tiny_beam_search_on_a_v5e_is_the_evaluations_grown_loop():
    config = _tiny()  # a short decode, to compile fast: fixed lengths (translate.translate's limited program)
    config.model.max_len, config.data.pack_length, config.eval.lengths = 24, 24, (24,)
    report = aot.compile_programs(config, aot.parse_target("tpu:v5e"), programs=("beam",), keep_hlo=True)["beam"]
    rows, max_len = dev.ROWS, 24  # sources of 24 tokens, 24 + 50 output tokens cut to the model's max_len
    assert report["batch"] == [rows, 24] and report["max_len"] == max_len and report["beam_size"] == aot.BEAM_SIZE
    memory = report["memory_bytes"]
    assert memory["output"] >= rows * max_len * 4  # the best hypothesis' tokens, int32
    assert memory["argument"] >= VOCAB * D_MODEL * 4 + rows * 24 * 4  # float32 embedding + the sources
    # at least one step's vocabulary projection for every beam of every source
    assert report["flops"] >= 2 * rows * aot.BEAM_SIZE * D_MODEL * VOCAB and memory["temp"] > 0
    hlo = report["hlo"]
    assert len(re.findall(r" while\(", hlo)) == len(decoding.cache_lengths(max_len)) == 2  # the cache at 16, then 24
    assert "opt-barrier" not in hlo


def test_refusal_of_a_compiled_program_that_does_not_fit():
    report = {"target": "tpu:v5e:1x1", "hbm_gib": 16, "memory_bytes": {"needed": int(18.3 * aot.GIB)}}
    assert aot.refusal("train", report) == "the train step needs 18.3 GiB a device; a v5e has 16"
    assert aot.refusal("train", {**report, "memory_bytes": {"needed": 15 * aot.GIB}}) is None
    assert aot.refusal("beam", report) == "beam search needs 18.3 GiB a device; a v5e has 16"


def test_targets_are_parsed_or_refused_by_name():
    assert aot.parse_target("tpu:v4:2x2x1").num_devices == 4 and aot.parse_target("tpu:v5e").topology == "1x1"
    assert aot.parse_target("cuda:h200:8").num_devices == 8 and aot.parse_target("cuda:h100").num_devices == 1
    # an H100 SXM's 80 GB (binary gigabytes of HBM3; the driver reports a little less usable), from its target config
    assert aot.parse_target("cuda:h100").chip.hbm_gib == pytest.approx(80, rel=0.02)
    for bad in ("tpu:v9:2x2", "cuda:v5e", "tpu:h100", "tpu:v5e:2x2x1", "tpu:v4:2x2", "cuda:h100:2x2", "cuda:h100:0"):
        with pytest.raises(ValueError, match=re.escape(f"--target = {bad!r}")):
            aot.parse_target(bad)


def test_hlo_counts_fusions_outside_fusion_bodies_and_collectives():
    hlo = """%fused_computation (p: f32[4]) -> f32[4] {
  %inner = f32[4]{0} fusion(%p), kind=kLoop, calls=%nested
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %fusion = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_computation
  %ar = (f32[4]{0}, bf16[2,3]{1,0}) all-reduce(%fusion, %a), replica_groups={}
  %cc = f32[4]{0} custom-call(%ar), custom_call_target="x"
  %fusion.remat = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_computation
  %bitcast.remat.12 = f32[2,2]{1,0} bitcast(%fusion.remat)
  ROOT %fusion.remat2 = f32[4]{0} fusion(%bitcast.remat.12), kind=kLoop, calls=%fused_computation
}
"""
    assert aot.hlo_counts(hlo) == {"fusions": 3, "custom_calls": 1, "rematerialized": 3}
    assert aot.collectives(hlo)["all-reduce"] == (1, 16 + 12)


def test_collective_bytes_of_eight_bit_floats_are_one_byte_an_element():
    """An all-reduce of f8e4m3fn [32, 32] and an all-gather of f8e5m2 [16] move 1024 and 16 bytes."""
    hlo = """ENTRY %main (a: f8e4m3fn[32,32], b: f8e5m2[8]) -> (f8e4m3fn[32,32], f8e5m2[16]) {
  %a = f8e4m3fn[32,32]{1,0} parameter(0)
  %b = f8e5m2[8]{0} parameter(1)
  %ar = f8e4m3fn[32,32]{1,0} all-reduce(%a), replica_groups={{0,1}}, to_apply=%add
  %ag = f8e5m2[16]{0} all-gather(%b), replica_groups={{0,1}}, dimensions={0}
  ROOT %out = (f8e4m3fn[32,32]{1,0}, f8e5m2[16]{0}) tuple(%ar, %ag)
}
"""
    found = aot.collectives(hlo)
    assert found["all-reduce"] == (1, 32 * 32) and found["all-gather"] == (1, 16)


def _fake_compile(needed_of, remat_of=lambda rows: 0):
    """A compile function whose train step needs `needed_of(rows)` bytes (None: XLA refuses it) and rematerialises
    `remat_of(rows)` instructions, and its calls."""
    calls = []

    def compile_fn(config, target, data, model, rows, programs, devices):
        calls.append(rows)
        needed = needed_of(rows)
        if needed is None:
            raise aot.DoesNotFit(f"the train step needs more than a {target.chip.name} has")
        return {
            "train": {
                "target": target.name,
                "hbm_gib": target.chip.hbm_gib,
                "memory_bytes": {"needed": needed},
                "rematerialized": remat_of(rows),
                "compile_s": 1.0,
            }
        }

    return compile_fn, calls


V5E = aot.parse_target("tpu:v5e")  # 16 GiB
LINE = lambda rows: aot.GIB + rows * (aot.GIB // 10)


def _largest(needed_of, lo=32, hi=64):
    compile_fn, calls = _fake_compile(needed_of)
    return aot.largest_rows(None, V5E, lo, hi, compile_fn=compile_fn), calls


def _brute_force(needed_of, granularity=8):
    fits = lambda r: (n := needed_of(r)) is not None and n <= 16 * aot.GIB
    return max(r for r in range(granularity, 1024, granularity) if fits(r))


def test_largest_rows_on_a_line_takes_the_seeds_and_two_confirmations():
    result, calls = _largest(LINE)
    assert result["rows"] == 144 == _brute_force(LINE) and result["needed_bytes"] == LINE(144)
    assert calls == [32, 64, 144, 152] and result["predicted"] == 144
    assert [c["stage"] for c in result["compiles"]] == ["seed", "seed", "confirm", "confirm"]
    assert [c["fits"] for c in result["compiles"]] == [True, True, True, False]


@pytest.mark.parametrize(
    "needed_of",
    [
        lambda r: LINE(r) + (3 * aot.GIB if r > 100 else 0),  # the line over-predicts: bisect below its prediction
        lambda r: None if r > 120 else LINE(r),  # XLA refuses above 120 rows (a TPU's usable HBM)
        lambda r: (
            aot.GIB + min(r, 100) * (aot.GIB // 10) + max(r - 100, 0) * (aot.GIB // 40)
        ),  # under-predicts: search upwards
        lambda r: None if r > 20 else LINE(r),  # the seeds do not fit: bisect from 0
    ],
    ids=["over", "refused", "under", "seeds_refused"],
)
def test_largest_rows_narrows_where_the_line_is_wrong(needed_of):
    result, calls = _largest(needed_of)
    assert result["rows"] == _brute_force(needed_of) and result["rows"] % 8 == 0
    assert len(calls) == len(set(calls)) < 1024 // 8 // 4  # no row count compiled twice, far fewer than a scan
    confirmed = [c for c in result["compiles"] if c["stage"] == "confirm"]
    if result["predicted"] is not None:  # refused at the seeds: no line, no prediction
        assert (
            confirmed[0]["rows"] == result["predicted"] and len(confirmed) == 1 + confirmed[0]["fits"]
        )  # none above a refusal
    assert any(not c["fits"] and c["rows"] == result["rows"] + 8 for c in result["compiles"])


def test_largest_rows_within_a_share_of_the_chip():
    compile_fn, _ = _fake_compile(LINE)
    result = aot.largest_rows(None, V5E, 32, 64, compile_fn=compile_fn, hbm_fraction=0.75)  # 12 GiB: 1 + 0.1 x 110
    assert result["rows"] == 104 and result["hbm_bytes"] == 12 * aot.GIB
    assert result["compiles"][-1]["why"] == "the train step needs 12.2 GiB a device, over 0.75 of its HBM"


def test_largest_rows_without_rematerialisation():
    # as XLA does: past 112 rows it recomputes to hold the program near 14.5 GiB, so memory alone would not bound it
    needed_of = lambda r: LINE(r) if r <= 112 else int(14.5 * aot.GIB)
    compile_fn, _ = _fake_compile(needed_of, lambda r: 0 if r <= 112 else 50)
    result = aot.largest_rows(None, V5E, 32, 64, compile_fn=compile_fn, without_remat=True)
    assert result["rows"] == 112 and result["needed_bytes"] == LINE(112)
    assert [c["why"] for c in result["compiles"] if c["rows"] == 120] == [
        "XLA rematerialised 50 instructions to fit it"
    ]


def test_largest_rows_says_where_more_rows_needed_less_memory():
    assert _largest(LINE)[0]["shrinks"] == []
    # as XLA's plan for the H100 base step did: a dip, at 152 rows, the line's first row count that should not fit
    dip = lambda r: LINE(r) - (2 * aot.GIB if r == 152 else 0)
    result, calls = _largest(dip)
    assert calls == [32, 64, 144, 152, 168, 160] and result["rows"] == 152  # 152 fit: gallop to 168, bisect
    assert result["shrinks"] == [(144, 152)]  # 152 rows needed 14.2 GiB, 144 rows 15.4
    note = aot.shrinks_note(result["shrinks"])
    assert note == (
        ". Needed memory did not grow with rows in these compiles (152 rows < 144): the answer is where the search "
        "narrowed to, and more rows may fit"
    )
    assert aot.shrinks_note([]) == ""


def test_largest_rows_when_nothing_fits_and_bad_seeds():
    result, _ = _largest(lambda r: None)
    assert result["rows"] == 0 and result["needed_bytes"] is None
    for lo, hi in ((30, 64), (64, 32), (0, 64)):
        with pytest.raises(ValueError, match="multiples of the granularity 8"):
            _largest(LINE, lo, hi)
