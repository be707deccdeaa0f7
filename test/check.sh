# The PASS/FAIL tally of the shell test scripts in test/ (sourced).
passed=0
failed=0
check() {  # check DESCRIPTION COMMAND...: passes when the command exits 0 (its output is dropped)
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then passed=$((passed + 1)); echo "PASS $what"; else failed=$((failed + 1)); echo "FAIL $what"; fi
}
tally() {  # tally NAME: the closing "N passed, M failed" line; exits 1 if any check failed
    echo "$1: $passed passed, $failed failed"
    exit $((failed > 0))
}
