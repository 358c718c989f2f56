// matvec kernels: being written.
#include "portability.h"
