# baton-lambda, the election Lambda, for one Auto Scaling group: the
# DynamoDB table of its election lease, the function (provided.al2023,
# reserved concurrency 1), its least-privilege role, the SNS topic the
# group notifies, the EventBridge rule for Auto Scaling events and the
# one-minute reconcile schedule. See docs/aws.md.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

variable "group_name" {
  type        = string
  description = "The Auto Scaling group whose leader the function tags."
}

variable "bootstrap_zip" {
  type        = string
  description = "A zip holding the bootstrap built from ./cmd/baton-lambda (GOOS=linux, CGO_ENABLED=0, -tags lambda.norpc)."
}

variable "architecture" {
  type        = string
  default     = "arm64"
  description = "arm64 or x86_64, as the bootstrap was built."
  validation {
    condition     = contains(["arm64", "x86_64"], var.architecture)
    error_message = "architecture must be arm64 or x86_64."
  }
}

variable "tag_key" {
  type    = string
  default = "app:isLeader"
}

variable "tag_value" {
  type    = string
  default = "true"
}

data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

resource "aws_dynamodb_table" "election" {
  name         = "baton-lambda-${var.group_name}"
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "pk"

  attribute {
    name = "pk"
    type = "S"
  }

  ttl {
    attribute_name = "expires"
    enabled        = true
  }
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "function" {
  statement {
    sid       = "ReadGroupsAndTags"
    actions   = ["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeTags"]
    resources = ["*"]
  }
  statement {
    sid       = "TagOnlyTheGroupsInstancesWithTheLeaderTags"
    actions   = ["ec2:CreateTags", "ec2:DeleteTags"]
    resources = ["arn:${data.aws_partition.current.partition}:ec2:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/aws:autoscaling:groupName"
      values   = [var.group_name]
    }
    condition {
      test     = "ForAllValues:StringEquals"
      variable = "aws:TagKeys"
      values   = [var.tag_key, "${var.tag_key}-token"]
    }
  }
  statement {
    sid       = "ElectionLease"
    actions   = ["dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem"]
    resources = [aws_dynamodb_table.election.arn]
    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = ["session:*", "lease:baton-lambda/${var.group_name}"]
    }
  }
  statement {
    sid       = "ElectionSessions"
    actions   = ["dynamodb:PutItem"]
    resources = [aws_dynamodb_table.election.arn]
    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = ["session:*"]
    }
  }
  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.function.arn}:*"]
  }
}

resource "aws_iam_role" "function" {
  name_prefix        = "baton-lambda-"
  assume_role_policy = data.aws_iam_policy_document.assume.json
}

resource "aws_iam_role_policy" "function" {
  role   = aws_iam_role.function.id
  policy = data.aws_iam_policy_document.function.json
}

resource "aws_cloudwatch_log_group" "function" {
  name              = "/aws/lambda/baton-lambda-${var.group_name}"
  retention_in_days = 30
}

resource "aws_lambda_function" "election" {
  function_name                  = "baton-lambda-${var.group_name}"
  role                           = aws_iam_role.function.arn
  filename                       = var.bootstrap_zip
  source_code_hash               = filebase64sha256(var.bootstrap_zip)
  handler                        = "bootstrap"
  runtime                        = "provided.al2023"
  architectures                  = [var.architecture]
  memory_size                    = 128
  timeout                        = 60
  reserved_concurrent_executions = 1

  environment {
    variables = {
      BATON_TABLE     = aws_dynamodb_table.election.name
      BATON_GROUPS    = var.group_name
      BATON_TAG_KEY   = var.tag_key
      BATON_TAG_VALUE = var.tag_value
    }
  }
  depends_on = [aws_cloudwatch_log_group.function]
}

resource "aws_sns_topic" "notifications" {
  name_prefix = "baton-lambda-"
}

resource "aws_sns_topic_subscription" "function" {
  topic_arn = aws_sns_topic.notifications.arn
  protocol  = "lambda"
  endpoint  = aws_lambda_function.election.arn
}

resource "aws_lambda_permission" "sns" {
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.election.function_name
  principal     = "sns.amazonaws.com"
  source_arn    = aws_sns_topic.notifications.arn
}

resource "aws_autoscaling_notification" "group" {
  group_names = [var.group_name]
  notifications = [
    "autoscaling:EC2_INSTANCE_LAUNCH",
    "autoscaling:EC2_INSTANCE_TERMINATE",
    "autoscaling:EC2_INSTANCE_LAUNCH_ERROR",
    "autoscaling:EC2_INSTANCE_TERMINATE_ERROR",
  ]
  topic_arn = aws_sns_topic.notifications.arn
}

resource "aws_cloudwatch_event_rule" "autoscaling" {
  name_prefix = "baton-lambda-"
  event_pattern = jsonencode({
    source = ["aws.autoscaling"]
    detail = { AutoScalingGroupName = [var.group_name] }
  })
}

resource "aws_cloudwatch_event_rule" "reconcile" {
  name_prefix         = "baton-lambda-"
  schedule_expression = "rate(1 minute)"
}

resource "aws_cloudwatch_event_target" "autoscaling" {
  rule = aws_cloudwatch_event_rule.autoscaling.name
  arn  = aws_lambda_function.election.arn
}

resource "aws_cloudwatch_event_target" "reconcile" {
  rule = aws_cloudwatch_event_rule.reconcile.name
  arn  = aws_lambda_function.election.arn
}

resource "aws_lambda_permission" "autoscaling" {
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.election.function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.autoscaling.arn
}

resource "aws_lambda_permission" "reconcile" {
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.election.function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.reconcile.arn
}

output "table" {
  value = aws_dynamodb_table.election.name
}

output "function" {
  value = aws_lambda_function.election.arn
}
