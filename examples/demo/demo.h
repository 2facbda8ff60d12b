/*
 * What the demo (demo.c) and its library (demo_util.c) share: the
 * library's functions and the attributes that keep every counted function
 * a traced call of its own.
 */
#ifndef FTRAMP_DEMO_H
#define FTRAMP_DEMO_H

/* libdemo_util.so */
unsigned long util_checksum(const char *line);
double util_scale(double x, int k);
const char *util_calls(int i, unsigned long *calls);

/*
 * Keep each function a call of its own under its own name: at -O2 gcc would
 * inline the small ones and specialise others into clones (`spin.isra.0`),
 * which ftramp traces too, under those names.
 */
#ifdef __clang__
#define FUNC __attribute__((noinline))
#else
#define FUNC __attribute__((noinline, noclone))
#endif
/* Not traced (no patch site), so the trace holds exactly the counted calls. */
#define NOTRACE __attribute__((no_instrument_function, patchable_function_entry(0, 0)))

#endif
