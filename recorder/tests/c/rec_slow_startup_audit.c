/* A second audit module (after the recorder's in LD_AUDIT) that keeps the
   program inside the loader's start-up for 100 ms after the start-up
   checkpoint, where the recorder has started its threads: what a loaded
   machine does to a starting program now and then.  Built without sites. */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <time.h>

unsigned la_version(unsigned version) {
    (void)version;
    return LAV_CURRENT;
}

void la_activity(uintptr_t *cookie, unsigned flag) {
    static int seen;
    (void)cookie;
    if (flag == LA_ACT_CONSISTENT && !seen++) {
        struct timespec ts = { 0, 100 * 1000 * 1000 };
        nanosleep(&ts, 0);
    }
}
