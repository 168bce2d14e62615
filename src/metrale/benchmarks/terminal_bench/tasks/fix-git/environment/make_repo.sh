#!/bin/bash
# Builds the site repository: two commits on master, three on a detached HEAD (the owner's
# lost work), master checked out again, then a fix on master that touches the line next to
# one the lost work rewrote (so merging conflicts there).
set -euo pipefail
repo="$1"
mkdir -p "$repo/css"
cd "$repo"
git init -q

cat > index.html <<'HTML'
<!DOCTYPE html>
<html>
<head><title>Lantern Bakery</title><link rel="stylesheet" href="css/style.css"></head>
<body>
<h1>Lantern Bakery</h1>
<p>Fresh bread every morning from six.</p>
<nav><a href="about.html">About</a></nav>
</body>
</html>
HTML
cat > css/style.css <<'CSS'
body { font-family: serif; background: #ffffff; color: #222222; }
h1 { color: #884400; }
CSS
git add -A && git commit -q -m "First version of the site"

cat > about.html <<'HTML'
<!DOCTYPE html>
<html>
<head><title>About</title><link rel="stylesheet" href="css/style.css"></head>
<body>
<h1>Abuot us</h1>
<p>We are a small bakery.</p>
<p>Open Tuesday to Sunday.</p>
</body>
</html>
HTML
git add -A && git commit -q -m "Add an about page"

# the owner's work, on a detached HEAD
git checkout -q --detach HEAD
sed -i 's|<p>We are a small bakery.</p>|<p>We are a bakery of three: Ana bakes, Bo sells, Cy delivers.</p>|' about.html
git commit -q -am "About: introduce the team"
cat > css/style.css <<'CSS'
body { font-family: sans-serif; background: #fdf6e3; color: #3b2f2f; }
h1 { color: #b35900; }
nav a { margin-right: 1em; }
CSS
git commit -q -am "New colour scheme"
cat > contact.html <<'HTML'
<!DOCTYPE html>
<html>
<head><title>Contact</title><link rel="stylesheet" href="css/style.css"></head>
<body>
<h1>Contact</h1>
<p>Call us on 555 0142 or drop by at 12 Mill Lane.</p>
</body>
</html>
HTML
sed -i 's|<nav><a href="about.html">About</a></nav>|<nav><a href="about.html">About</a> <a href="contact.html">Contact</a></nav>|' index.html
git add -A && git commit -q -m "Add a contact page"

git checkout -q master
# a fix on master, on the line above the one the lost work rewrote
sed -i 's|<h1>Abuot us</h1>|<h1>About us</h1>|' about.html
git commit -q -am "Fix a typo in the about heading"
