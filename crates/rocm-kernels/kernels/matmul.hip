// matmul kernels: being written.
#include "portability.h"
