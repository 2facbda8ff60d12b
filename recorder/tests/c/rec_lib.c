/* A library the recorder tests dlopen: reclib_sum(n) calls reclib_add n times. */
__attribute__((noinline)) long reclib_add(long a, long b) { return a + b; }

long reclib_sum(long n)
{
    long s = 0;
    for (long i = 1; i <= n; i++)
        s = reclib_add(s, i);
    return s;
}
