"""rollout-pipeline: a declarative, Hydra-configured rollout data pipeline for LLM RL.

Public names users build on are re-exported here.
"""

from pipeline.resolvers import register_resolvers
from pipeline.sample import Sample
from pipeline.data.sources import BufferedDataSource, PlainDataSource
from pipeline.rollout.contracts import DynamicFilterOutput, RolloutFnEvalOutput, RolloutFnTrainOutput

# the YAML configs use them (`${multiply:...}`): register before any config is composed
register_resolvers()

__all__ = [
    "Sample",
    "PlainDataSource",
    "BufferedDataSource",
    "RolloutFnTrainOutput",
    "RolloutFnEvalOutput",
    "DynamicFilterOutput",
    "load_train_data",
]


def __getattr__(name: str):
    """Lazy public names (keep `import pipeline` light: no torch until needed)."""
    if name == "load_train_data":
        from pipeline.sinks.files import load_train_data

        return load_train_data
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
