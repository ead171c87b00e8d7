"""hvd.keras.callbacks: the callbacks of hvd.tensorflow.keras.callbacks
(the same classes), under horovod.keras.callbacks' name."""

from hvd.tensorflow.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, MetricAverageCallback, __all__)
