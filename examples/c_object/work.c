__attribute__((noinline)) long work(long a, long b)
{
	return a * 10 + b;
}
