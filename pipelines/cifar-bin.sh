# cifar-bin.sh: sourced by the pipeline scripts; sets BIN, the folder of the commands.
#
#   $BIN when set; else the checkout's bin/ next to pipelines/ (a build tree);
#   else PREFIX/bin for a script installed in PREFIX/share/cifar/ (make install);
#   else the folder of cifar-train on PATH. When none has the commands, BIN stays
#   the checkout's bin/ and the script's "not built" check names it.
# Usage (after setting `here` to the script's folder): . "$here/cifar-bin.sh"
cifar_bin_dir() {
  local here=$1 d
  if [ -x "$here/../bin/cifar-train" ]; then (cd "$here/../bin" && pwd); return; fi
  case $here in
    */share/cifar)
      d=${here%/share/cifar}/bin
      if [ -x "$d/cifar-train" ]; then echo "$d"; return; fi ;;
  esac
  if d=$(command -v cifar-train); then dirname "$d"; return; fi
  echo "$here/../bin"
}
BIN=${BIN:-$(cifar_bin_dir "$here")}
