// rope kernels: being written.
#include "portability.h"
