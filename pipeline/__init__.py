"""rollout-pipeline: a declarative, Hydra-configured rollout data pipeline for LLM RL.

Public names users build on are re-exported here.
"""

from pipeline.sample import Sample
from pipeline.rollout.contracts import DynamicFilterOutput, RolloutFnEvalOutput, RolloutFnTrainOutput

__all__ = [
    "Sample",
    "RolloutFnTrainOutput",
    "RolloutFnEvalOutput",
    "DynamicFilterOutput",
]
