# curves.gp: training curves of one cifar-train run, drawn by pipelines/plot.sh.
#
#   gnuplot -e "datafile='TABLE'; outfile='OUT.png'; runname='NAME'" pipelines/curves.gp
#
# TABLE has one row per epoch: epoch train_loss train_acc test_loss test_acc
# (accuracies as fractions), as plot.sh extracts them from RUN_DIR/metrics.jsonl.
# Left: cross-entropy loss per epoch (log scale: the first epochs' test loss can be
# orders of magnitude above the rest while the BN statistics settle). Right: accuracy.
if (!exists("datafile") || !exists("outfile")) {
    print "curves.gp: set datafile and outfile with -e"
    exit status 2
}
if (!exists("runname")) runname = datafile

set terminal pngcairo size 1200,480 enhanced font ",11"
set output outfile
set datafile missing "NaN"
set multiplot layout 1,2 title sprintf("cifar-train: %s", runname) noenhanced

set xlabel "epoch"
set grid
set key top right
set logscale y
set ylabel "loss"
set title "loss"
plot datafile using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "train", \
     ''       using 1:4 with linespoints pt 5 ps 0.6 lw 2 title "test"

unset logscale y
set ylabel "accuracy (%)"
set title "accuracy"
set yrange [0:100]
set key bottom right
plot datafile using 1:($3*100) with linespoints pt 7 ps 0.6 lw 2 title "train", \
     ''       using 1:($5*100) with linespoints pt 5 ps 0.6 lw 2 title "test"

unset multiplot
