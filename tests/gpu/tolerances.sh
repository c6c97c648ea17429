# shellcheck shell=bash disable=SC2034
# tests/gpu/tolerances.sh: the tolerances of tests/gpu/run.sh and the checks that use
# them, sourced by run.sh and by tests/gpu_tolerances.bats (which runs them on
# recorded curves in `make test`, no GPU needed). Plain bash + awk.
#
# Two kinds of comparison, never mixed up:
#
# 1. Before any chaos: runs with --lr 0 (one epoch: the parameters never move, so
#    the epoch's train loss is the mean cross-entropy of the initial network over
#    the augmented training batches, BN in training mode, and its test loss that of
#    the running statistics the epoch accumulated). Two devices then differ by
#    rounding alone, and the tolerance follows from the arithmetic:
#
#    FP32_REL: unit roundoff u = 2^-24 = 6.0e-8. A sum of K products in any order
#    errs by at most K*u relatively, to first order (Higham, "Accuracy and
#    Stability of Numerical Algorithms", 2nd ed., section 3.1; it covers OpenBLAS's
#    and cuDNN's GEMM and direct orders alike). The seed model's longest conv
#    reduction is 3*3*64 = 576 terms: 576u = 3.5e-5 per layer. Its 58 convs are each
#    followed by a BN that renormalises (relative condition about 1), so the errors
#    add at most linearly through the depth: 58 * 3.5e-5 = 2.0e-3 on the logits.
#    The mean cross-entropy CE = logsumexp(z) - z_y moves by at most 2 max|dz|, a
#    relative change of 2 max|z| / CE times the logits', about 1 at initialisation
#    (|z| of order 1, CE near ln 10). cuDNN may pick transform algorithms (FFT,
#    Winograd) whose error bounds are norm-wise rather than per element: a factor
#    5 for those gives FP32_REL = 1e-2. (Measured on one CPU, two OpenBLAS kernels'
#    summation orders, OPENBLAS_CORETYPE=Haswell vs Sandybridge: identical to the 6
#    printed digits, so the bound is far from tight.)
#
#    BF16_REL (bf16 against fp32 on the GPU): bfloat16 keeps 8 significant bits,
#    round to nearest: u16 = 2^-9 = 2.0e-3 per stored value. Each conv reads a
#    rounded input and a rounded weight and its output is rounded once: 3 u16 per
#    layer (the fp32 accumulation inside is negligible beside it). Worst case
#    linear in depth would be 58 * 3 u16 = 0.34, a bound that tests nothing; the
#    roundings of different layers are independent, and for independent errors the
#    probabilistic analysis (Higham & Mary, "A new approach to probabilistic
#    rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019) bounds the sum by
#    sqrt(n) times the per-term error with high probability: sqrt(58) * 3 u16 =
#    0.045, with the cross-entropy factor of about 1 as above: BF16_REL = 0.05.
#
# 2. After chaos: the 3-epoch runs of a ResNet at lr 0.1 diverge from rounding
#    differences within the first epoch (on one CPU two OpenBLAS kernels already
#    end 3 epochs at train loss 0.82 and 0.58, test accuracy 45.5% and 59.8%), so
#    their curves are not compared with each other at all. Each is only checked
#    to learn, clearly above chance:
#      - its last train loss below ln(10) / 2 = 1.15 (the uniform guess scores
#        ln 10 = 2.30; a network that learned nothing cannot score below it on
#        balanced classes);
#      - its last test accuracy above chance by six binomial standard deviations:
#        0.1 + 6 sqrt(0.1 * 0.9 / N) on N test images (0.18 for N = 512), which a
#        guesser passes with probability under 1e-8.
#    Runs that must be the same arithmetic (the GPU run without CUDA graphs, with
#    two-kernel batch norms, with the data streamed: same kernels, same sums in the
#    same order) are compared to SAME_REL = 1e-4: equal by construction, the margin
#    only covers the 6 printed digits.

FP32_REL=1e-2
BF16_REL=0.05
SAME_REL=1e-4

# field NAME < metrics.jsonl: NAME's value on each line.
tol_field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }

# tol_rel_close A B REL: scalars, |A - B| <= REL * |A| (both present).
tol_rel_close() {
    awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { if (a == "" || b == "") exit 1;
        d = a - b; if (d < 0) d = -d; t = a < 0 ? -a : a; exit !(d <= r * t) }'
}

# tol_curves_close A B REL: two equally long non-empty series (space separated),
# B within REL of A (relative) at every point.
tol_curves_close() {
    awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
        if (n == 0 || n != m) exit 1;
        for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; t = x[i] < 0 ? -x[i] : x[i];
            if (d > r * t) exit 1 } }'
}

# tol_chance_floor N: the test accuracy a run must beat on N images (chance + 6 sd).
tol_chance_floor() { awk -v n="$1" 'BEGIN { printf "%.4f\n", 0.1 + 6 * sqrt(0.09 / n) }'; }

# tol_learns METRICS N: the run's last train loss below ln(10)/2 and its last test
# accuracy above tol_chance_floor N. Prints the reason when not.
tol_learns() {
    local loss acc floor
    loss=$(tol_field train_loss <"$1" 2>/dev/null | tail -1)
    acc=$(tol_field test_acc <"$1" 2>/dev/null | tail -1)
    floor=$(tol_chance_floor "$2")
    if [ -z "$loss" ] || [ -z "$acc" ]; then
        echo "no train_loss / test_acc in $1"
        return 1
    fi
    awk -v l="$loss" -v a="$acc" -v f="$floor" 'BEGIN { exit !(l < log(10) / 2 && a > f) }' && return 0
    echo "last train loss $loss (want < $(awk 'BEGIN { printf "%.4f", log(10) / 2 }')), last test accuracy $acc (want > $floor)"
    return 1
}

# tol_first_close A.jsonl B.jsonl REL: the --lr 0 runs' train and test losses.
tol_first_close() {
    local f a b
    for f in train_loss test_loss; do
        a=$(tol_field "$f" <"$1" 2>/dev/null | head -1)
        b=$(tol_field "$f" <"$2" 2>/dev/null | head -1)
        if ! tol_rel_close "$a" "$b" "$3"; then
            echo "$f ${a:-none} vs ${b:-none}: more than $3 relative apart"
            return 1
        fi
    done
}
