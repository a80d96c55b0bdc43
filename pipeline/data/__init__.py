"""The data layer: prompt datasets, epoch order, data sources, buffer filters, checkpoints."""

from pipeline.data.buffer_filters import OldestFirst, oldest_first, pop_first, reward_topk
from pipeline.data.dataset import PromptDataset
from pipeline.data.errors import CheckpointError, DataError, DataFingerprintMismatch
from pipeline.data.order import epoch_permutation
from pipeline.data.sources import BufferedDataSource, PlainDataSource

__all__ = [
    "PlainDataSource", "BufferedDataSource", "PromptDataset", "epoch_permutation",
    "pop_first", "reward_topk", "oldest_first", "OldestFirst",
    "DataError", "CheckpointError", "DataFingerprintMismatch",
]
