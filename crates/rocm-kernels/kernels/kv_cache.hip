// kv_cache kernels: being written.
#include "portability.h"
