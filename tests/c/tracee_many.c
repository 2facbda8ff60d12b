/* Many small traced functions spread over several pages, for the batch
 * patching tests (exectest/tests/patching.rs): tracee_many[i](x) returns
 * x * 3 + tracee_many_k[i].  320 functions, 64-byte aligned: more sites
 * than one patch round holds (256) and five pages of text. */
#define TRACEE __attribute__((noinline, noclone, noipa, aligned(64)))

#define F(n) TRACEE long tracee_many_##n(long x) { return x * 3 + n; }
#define P(n) tracee_many_##n,
#define K(n) n,
#define ROW(X, d) X(d##0) X(d##1) X(d##2) X(d##3) X(d##4) X(d##5) X(d##6) X(d##7)
#define ROWS(X) \
	ROW(X, 10) ROW(X, 11) ROW(X, 12) ROW(X, 13) ROW(X, 14) ROW(X, 15) ROW(X, 16) ROW(X, 17) \
	ROW(X, 18) ROW(X, 19) ROW(X, 20) ROW(X, 21) ROW(X, 22) ROW(X, 23) ROW(X, 24) ROW(X, 25) \
	ROW(X, 26) ROW(X, 27) ROW(X, 28) ROW(X, 29) ROW(X, 30) ROW(X, 31) ROW(X, 32) ROW(X, 33) \
	ROW(X, 34) ROW(X, 35) ROW(X, 36) ROW(X, 37) ROW(X, 38) ROW(X, 39) ROW(X, 40) ROW(X, 41) \
	ROW(X, 42) ROW(X, 43) ROW(X, 44) ROW(X, 45) ROW(X, 46) ROW(X, 47) ROW(X, 48) ROW(X, 49)

ROWS(F)

long (*const tracee_many[])(long) = { ROWS(P) };
const long tracee_many_k[] = { ROWS(K) };
const unsigned long tracee_many_count = sizeof tracee_many / sizeof tracee_many[0];
