#!/usr/bin/perl
# A STOMP client from outside the Python ecosystem: Perl's Net::Stomp (Debian libnet-stomp-perl).
#
#   stomp_roundtrip.pl HOST PORT USER PASS VHOST DESTINATION COUNT [VERSION]
#
# Connects (CONNECT carries host:VHOST, which RabbitMQ reads as the virtual host), subscribes
# to DESTINATION with ack:client (waiting for the RECEIPT), sends COUNT messages with custom
# headers, receives them all in order, checks every body and header and ACKs each one, then
# disconnects (waiting for the RECEIPT). A second connection then subscribes again and checks
# that nothing is redelivered, i.e. that the ACKs reached the broker.
#
# Even-numbered messages are text frames without content-length; odd-numbered ones carry
# content-length and a binary body with NUL and newline bytes. VERSION is the STOMP version
# to offer (1.0, 1.1 or 1.2; default 1.2); with 1.1 and 1.2 a header value with escaped
# characters is sent too and must come back decoded to the same bytes.
#
# Prints one line of JSON ({"ok":true,...} or {"ok":false,"error":...}) on stdout and exits 0
# only when everything matched. The whole run is bounded by 30 seconds.
use strict;
use warnings;

use JSON::PP ();
use Net::Stomp ();
use Time::HiRes qw(time);

my $TOTAL_SECONDS = 30;     # hard bound on the whole run
my $QUIET_SECONDS = 1;      # how long the second connection waits for (unwanted) redeliveries
my $started = time;
my $deadline = $started + $TOTAL_SECONDS - 1;
my %summary = (client => "perl $^V Net::Stomp $Net::Stomp::VERSION");

sub finish {
    my ($ok, $error) = @_;
    $summary{ok} = $ok ? JSON::PP::true : JSON::PP::false;
    $summary{error} = $error if defined $error;
    $summary{elapsed_s} = sprintf('%.3f', time - $started) + 0;
    print JSON::PP->new->canonical->encode(\%summary), "\n";
    exit($ok ? 0 : 1);
}

sub fail {
    my ($msg) = @_;
    $msg =~ s/ at \S+ line \d+\.?//g;   # Perl's "at FILE line N." noise
    $msg =~ s/\s+\z//;
    finish(0, $msg);
}

$SIG{ALRM} = sub { fail("timed out after $TOTAL_SECONDS s") };
alarm($TOTAL_SECONDS);

# Net::Stomp silently reconnects (and resubscribes) when the connection drops; for a test that
# would hide exactly the failures we look for, so a lost connection is fatal here.
{
    no warnings 'redefine';
    *Net::Stomp::_reconnect = sub { die "connection to the server was lost\n" };
}

@ARGV == 7 || @ARGV == 8
    or fail('usage: stomp_roundtrip.pl HOST PORT USER PASS VHOST DESTINATION COUNT [VERSION]');
my ($host, $port, $user, $pass, $vhost, $destination, $count, $version) = @ARGV;
$version //= '1.2';
$count =~ /\A[1-9][0-9]*\z/ or fail("COUNT must be a positive integer, not '$count'");
$version =~ /\A1\.[012]\z/ or fail("VERSION must be 1.0, 1.1 or 1.2, not '$version'");
@summary{qw(server destination count offered_version)} =
    ("$host:$port", $destination, $count + 0, $version);

my $run = sprintf('%x-%x', $$, int($started * 1000));   # tells this run's messages apart

# --- STOMP 1.1/1.2 header value escaping (Net::Stomp itself does none) ---------------------
sub escape {
    my ($v) = @_;
    return $v if $summary{version} eq '1.0';
    $v =~ s/\\/\\\\/g; $v =~ s/\n/\\n/g; $v =~ s/:/\\c/g;
    $v =~ s/\r/\\r/g if $summary{version} eq '1.2';
    return $v;
}

sub unescape {
    my ($v) = @_;
    return $v if !defined $v || $summary{version} eq '1.0';
    my %map = ('\\' => '\\', n => "\n", c => ':', r => "\r");
    $v =~ s/\\(.)/exists $map{$1} ? $map{$1} : fail("undefined escape \\$1 in '$v'")/ge;
    return $v;
}

# --- connection helpers ---------------------------------------------------------------------
sub remaining { my $left = $deadline - time; return $left > 0 ? $left : 0 }

sub open_connection {
    my $stomp = eval {
        Net::Stomp->new({
            hostname => $host, port => $port, timeout => 5,
            initial_reconnect_attempts => 1, reconnect_attempts => 1, connect_delay => 0,
        });
    } or fail("cannot connect to $host:$port: " . ($@ || 'unknown error'));
    my $reply = eval {
        $stomp->connect({
            login => $user, passcode => $pass, host => $vhost,
            # Without accept-version the server speaks STOMP 1.0.
            ($version eq '1.0' ? () : ('accept-version' => $version, 'heart-beat' => '0,0')),
        });
    };
    fail("CONNECT failed: $@") if $@;
    fail('no reply to CONNECT') unless $reply;
    if ($reply->command ne 'CONNECTED') {
        my $why = $reply->headers->{message} // $reply->body // '';
        fail('CONNECT answered with ' . $reply->command . ": $why");
    }
    return ($stomp, $reply);
}

# The next frame, or undef when none arrives within $timeout (bounded by the overall deadline).
# An ERROR frame is fatal.
sub next_frame {
    my ($stomp, $timeout) = @_;
    $timeout = remaining() if !defined $timeout || $timeout > remaining();
    my $frame = eval { $stomp->receive_frame({ timeout => $timeout }) };
    fail("receiving: $@") if $@;
    if ($frame && $frame->command eq 'ERROR') {
        my $h = $frame->headers || {};
        fail('server sent ERROR: ' . ($h->{message} // '') . ' ' . ($frame->body // ''));
    }
    return $frame;
}

sub wait_receipt {
    my ($stomp, $id, $what) = @_;
    while (1) {
        my $frame = next_frame($stomp);
        fail("no RECEIPT for $what (connection closed or timed out)") unless $frame;
        next unless $frame->command eq 'RECEIPT';   # a MESSAGE here would be checked later
        my $got = $frame->headers->{'receipt-id'} // '';
        return if $got eq $id;
        fail("RECEIPT for $what has receipt-id '$got', expected '$id'");
    }
}

sub send_frame {
    my ($stomp, $command, $headers, $body) = @_;
    my $frame = Net::Stomp::Frame->new({ command => $command, headers => $headers, body => $body });
    eval { $stomp->send_frame($frame); 1 } or fail("sending $command: $@");
}

# --- expected messages ----------------------------------------------------------------------
my $note = "a:b\\c \xc3\xa9 end";   # exercises \c and \\ escapes and UTF-8 in 1.1/1.2
sub body_of {
    my ($i) = @_;
    my $text = "net-stomp message $i of $count (run $run) caf\xc3\xa9";
    return $i % 2 ? "$text\n\0binary\0\n" : $text;
}

# --- first connection: subscribe, send, receive, ack ---------------------------------------
my ($stomp, $connected) = open_connection();
$summary{version} = $connected->headers->{version} // '1.0';
$summary{version} eq $version
    or fail("offered STOMP $version, server negotiated $summary{version}");
$summary{server_header} = $connected->headers->{server} if $connected->headers->{server};

my $sub_id = "perl-$run";
send_frame($stomp, 'SUBSCRIBE',
    { destination => $destination, id => $sub_id, ack => 'client', receipt => "sub-$run" });
wait_receipt($stomp, "sub-$run", 'SUBSCRIBE');

for my $i (0 .. $count - 1) {
    my %headers = (
        destination => $destination,
        'x-foreign-client' => 'perl-net-stomp',
        'x-run' => $run,
        'x-seq' => $i,
    );
    $headers{'x-note'} = escape($note) if $summary{version} ne '1.0';
    $headers{'content-length'} = length(body_of($i)) if $i % 2;
    send_frame($stomp, 'SEND', \%headers, body_of($i));
}
$summary{sent} = $count + 0;

my ($received, $acked) = (0, 0);
while ($received < $count) {
    my $frame = next_frame($stomp);
    fail("received $received of $count messages (connection closed or timed out)") unless $frame;
    my $cmd = $frame->command;
    fail("unexpected $cmd frame while waiting for messages") unless $cmd eq 'MESSAGE';
    my $h = $frame->headers;
    my $i = $received;
    my $where = "message $i";
    ($h->{'x-run'} // '') eq $run
        or fail("$where: x-run is '" . ($h->{'x-run'} // '(missing)') . "', expected '$run'");
    my $seq = $h->{'x-seq'} // '(missing)';
    $seq eq "$i" or fail("$where: x-seq is '$seq' (out of order or lost)");
    ($h->{'x-foreign-client'} // '') eq 'perl-net-stomp'
        or fail("$where: x-foreign-client header is wrong or missing");
    if ($summary{version} ne '1.0') {
        my $got = unescape($h->{'x-note'});
        defined $got && $got eq $note
            or fail("$where: x-note is " . JSON::PP->new->allow_nonref->encode($got // 'missing')
                    . ', expected ' . JSON::PP->new->allow_nonref->encode($note));
    }
    ($h->{subscription} // '') eq $sub_id
        or fail("$where: subscription header is '" . ($h->{subscription} // '') . "'");
    my $body = $frame->body // '';
    $body eq body_of($i)
        or fail("$where: body mismatch: got " . JSON::PP->new->allow_nonref->encode($body));
    $received++;

    # The ACK frame differs per version: 1.2 names the message by its ack header, 1.1 by
    # message-id and subscription, 1.0 by message-id alone.
    my %ack;
    if ($summary{version} eq '1.2') {
        defined $h->{ack} or fail("$where: STOMP 1.2 MESSAGE without an ack header");
        %ack = (id => $h->{ack});
    } else {
        defined $h->{'message-id'} or fail("$where: MESSAGE without message-id");
        %ack = ('message-id' => $h->{'message-id'});
        $ack{subscription} = $sub_id if $summary{version} eq '1.1';
    }
    $ack{receipt} = "ack-$run" if $received == $count;
    send_frame($stomp, 'ACK', \%ack);
    $acked++;
}
wait_receipt($stomp, "ack-$run", 'the last ACK');
@summary{qw(received acked)} = ($received, $acked);

# Nothing else may arrive: no duplicates.
if (my $extra = next_frame($stomp, 0.3)) {
    fail('unexpected ' . $extra->command . ' frame after all messages were received');
}

send_frame($stomp, 'DISCONNECT', { receipt => "bye-$run" });
wait_receipt($stomp, "bye-$run", 'DISCONNECT');
eval { $stomp->_close_socket };

# --- second connection: the ACKs must have removed every message ---------------------------
my ($again) = open_connection();
send_frame($again, 'SUBSCRIBE',
    { destination => $destination, id => "again-$run", ack => 'auto', receipt => "sub2-$run" });
wait_receipt($again, "sub2-$run", 'the second SUBSCRIBE');
my $redelivered = 0;
while (my $frame = next_frame($again, $QUIET_SECONDS)) {
    $redelivered++ if $frame->command eq 'MESSAGE';
}
$summary{redelivered_after_ack} = $redelivered;
fail("$redelivered acknowledged message(s) were delivered again") if $redelivered;
send_frame($again, 'DISCONNECT', { receipt => "bye2-$run" });
wait_receipt($again, "bye2-$run", 'the second DISCONNECT');
eval { $again->_close_socket };

finish(1);
