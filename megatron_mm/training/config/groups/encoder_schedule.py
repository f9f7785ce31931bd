"""Where and when the encoders run: in the LLM's pipeline chunks, as their own pipeline in its
    bubbles, or on ranks of their own."""

from dataclasses import dataclass
from typing import Literal, Optional


@dataclass(frozen=True)
class EncoderScheduleArgs:
    """Where and when the encoders run: in the LLM's pipeline chunks, as their own pipeline in its
    bubbles, or on ranks of their own."""

    encoder_schedule: Literal["megatron", "coarse", "bubble", "separate", "auto"] = "megatron"
    """megatron: Megatron-Core's schedules, encoders inside the pipeline chunks that
    --pipeline-partition gives them; coarse: the encoder as its own pipeline over the ranks, all
    its forwards before the LLM's work and its backwards after; bubble: its pieces placed in the
    LLM pipeline's bubbles (Optimus); separate: the encoders on ranks of their own
    (--encoder-data-parallel-size), next to the LLM's (planned and simulated; the training
    runtime refuses it yet); auto: the one of megatron, coarse, bubble (and its encoder PP and
    pieces) the simulator finds fastest on this run's costs"""
    encoder_pipeline_model_parallel_size: Optional[int] = None
    """encoder pipeline stages for --encoder-schedule coarse|bubble; divides
    --pipeline-model-parallel-size (default: equal to it)"""
    encoder_tensor_model_parallel_size: Optional[int] = None
    """the encoder layers' tensor parallelism with --encoder-schedule coarse|bubble; divides
    --tensor-model-parallel-size (default: equal to it). Smaller: each TP group holds TP / this
    many encoder replicas, each running the encoder for its share of the micro-batches. With
    separate: each encoder replica's ranks"""
    encoder_data_parallel_size: Optional[int] = None
    """with --encoder-schedule separate: encoder replicas on ranks of their own, each of
    --encoder-tensor-model-parallel-size ranks (default 1 there), the world's first ranks; the
    LLM's data-parallel size is what the rest leave (Megatron-Bridge MIMO's per-module
    data_parallel_size)"""
    vision_encoder_data_parallel_size: Optional[int] = None
    """with --encoder-schedule separate: the vision encoder on replicas of its own, this many
    (default 1 once any encoder's is given), each of --encoder-tensor-model-parallel-size ranks;
    the encoders' replica sets come first in chain order (vision, audio), the LLM after them
    (Megatron-Bridge MIMO's per-module data_parallel_size and rank_offset)"""
    audio_encoder_data_parallel_size: Optional[int] = None
    """with --encoder-schedule separate: the audio encoder on replicas of its own, this many
    (default 1 once any encoder's is given), each of --encoder-tensor-model-parallel-size ranks;
    the encoders' replica sets come first in chain order (vision, audio), the LLM after them
    (Megatron-Bridge MIMO's per-module data_parallel_size and rank_offset)"""
    encoder_virtual_pipeline_model_parallel_size: Optional[int] = None
    """with coarse|bubble: interleave the encoder over its pipeline as
    --virtual-pipeline-model-parallel-size interleaves the LLM: its layers run this many rounds
    over the encoder's stages, each rank holding one range per round, so the first micro-batch's
    first piece (which the other ranks wait for) and the last one's backward are this many times
    shorter (default 1: not interleaved)"""
    encoder_pieces: int = 1
    """pieces per encoder stage with coarse|bubble: finer pieces fit shorter bubbles"""
    encoder_placement: Literal["first", "last", "auto"] = "auto"
    """which end of the pipeline the encoder's first stage sits at with coarse|bubble: first (rank
    0) or last (its forwards start on the last rank, idle in the LLM's warm-up, and its
    backwards end on the first, idle in the cool-down); auto: the faster of the two in
    simulation for bubble, first for coarse"""
