// norm kernels: being written.
#include "portability.h"
