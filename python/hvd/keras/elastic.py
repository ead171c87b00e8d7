"""hvd.keras.elastic: hvd.tensorflow.keras.elastic under Horovod's name
horovod.keras.elastic (the same classes)."""

from hvd.tensorflow.keras.elastic import (  # noqa: F401
    CommitStateCallback, KerasState, UpdateBatchStateCallback,
    UpdateEpochStateCallback, __all__, run)
