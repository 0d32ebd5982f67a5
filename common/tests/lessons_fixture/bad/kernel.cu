// A fixture for common/tests/check_lessons.py: names that are not defined here.
static int only_declared(int x);

static int defined_here(int x) {
    return only_called(x) + only_declared(x);
}
