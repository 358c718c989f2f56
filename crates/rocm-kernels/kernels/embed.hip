// embed kernels: being written.
#include "portability.h"
