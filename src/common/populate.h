// common/populate.h - the names of madvise's page-populating advice, which headers older than
// Linux 5.14 lack. Such a kernel answers EINVAL; every caller has a fallback for that.
#pragma once

#include <sys/mman.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
