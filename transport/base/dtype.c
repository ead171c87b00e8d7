#include "transport/base/dtype.h"

int hvd_dtype_valid(hvd_dtype dtype) {
    switch (dtype) {
    case HVD_UINT8:
    case HVD_INT8:
    case HVD_INT32:
    case HVD_INT64:
    case HVD_FLOAT16:
    case HVD_BFLOAT16:
    case HVD_FLOAT32:
    case HVD_FLOAT64:
        return 1;
    }
    return 0;
}

int hvd_op_valid(hvd_op op) {
    switch (op) {
    case HVD_SUM:
    case HVD_AVERAGE:
    case HVD_MIN:
    case HVD_MAX:
    case HVD_PRODUCT:
        return 1;
    case HVD_ADASUM:
        return 0;
    }
    return 0;
}

const char *hvd_dtype_name(hvd_dtype dtype) {
    switch (dtype) {
    case HVD_UINT8:
        return "uint8";
    case HVD_INT8:
        return "int8";
    case HVD_INT32:
        return "int32";
    case HVD_INT64:
        return "int64";
    case HVD_FLOAT16:
        return "float16";
    case HVD_BFLOAT16:
        return "bfloat16";
    case HVD_FLOAT32:
        return "float32";
    case HVD_FLOAT64:
        return "float64";
    }
    return "invalid";
}

const char *hvd_op_name(hvd_op op) {
    switch (op) {
    case HVD_ADASUM:
        return "adasum";
    case HVD_SUM:
        return "sum";
    case HVD_AVERAGE:
        return "average";
    case HVD_MIN:
        return "min";
    case HVD_MAX:
        return "max";
    case HVD_PRODUCT:
        return "product";
    }
    return "invalid";
}

size_t hvd_dtype_size(hvd_dtype dtype) {
    switch (dtype) {
    case HVD_UINT8:
    case HVD_INT8:
        return 1;
    case HVD_FLOAT16:
    case HVD_BFLOAT16:
        return 2;
    case HVD_INT32:
    case HVD_FLOAT32:
        return 4;
    case HVD_INT64:
    case HVD_FLOAT64:
        return 8;
    }
    return 0;
}
